// The decoder layers of a LLaMA-family model in float32 on the CPU, one call per forward.
//
// Written out in Python, each layer is ~35 small torch operations: on 2 cores they took
// 7.5 ms of a 16.4 ms SmolLM2-135M one-token forward whose products take 8.8 ms. Here a
// layer is its products (small_gemm.cpp, or the torch kernel the machine's table picks)
// with a few loops between them.
//
// Lossless by construction: every token's arithmetic is the same whatever else the pass
// holds. Products give a row the same bits in any batch; attention scores each visible key
// with the same dot product and sums keys in cache order, where a key the token may not see
// adds an exact zero. So a verify pass (a chain, or a tree whose accepted path sits between
// rejected siblings) scores each token exactly as a one-token step does.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "native.h"

namespace autotune {

namespace {

enum Kernel : int64_t { LINEAR = 0, TRANSPOSED = 1, SMALL = 2 };
enum MaskMode : int64_t { CAUSAL = 0, NEW_TOKENS = 1, WHOLE = 2 };
constexpr int64_t QUERY_BLOCK = 8;         // query rows per attention task
constexpr int64_t INLINE_WORK = 1 << 18;   // multiply-adds below which attention stays on one thread

inline vec16 splat(float v) { return vec16{} + v; }

// e^x, within about one unit in the last place; 0 below -87 and +inf above 88.
inline vec16 exp16(vec16 x) {
  const vec16 low = splat(-87.0f), high = splat(88.0f);
  const vec16 clamped = x < low ? low : (x > high ? high : x);
  // x = n ln2 + r with |r| <= ln2 / 2: adding 1.5 * 2^23 rounds x / ln2 to an integer n
  const vec16 shifter = splat(12582912.0f);
  const vec16 shifted = clamped * splat(1.44269504088896341f) + shifter;
  const vec16 n = shifted - shifter;
  // ln2 in two parts, the first exact in few bits, so that r keeps its precision
  const vec16 r = (clamped - n * splat(0.693359375f)) - n * splat(-2.12194440e-4f);
  // e^r by its Taylor series to r^7 / 7!
  vec16 p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  // times 2^n, n added to the exponent field (n sits in the low bits of ``shifted``)
  ivec16 bits, nbits;
  std::memcpy(&bits, &p, sizeof bits);
  std::memcpy(&nbits, &shifted, sizeof nbits);
  bits += (nbits - 0x4B400000) << 23;
  vec16 out;
  std::memcpy(&out, &bits, sizeof out);
  out = x < low ? splat(0.0f) : out;
  return x > high ? splat(std::numeric_limits<float>::infinity()) : out;
}

struct Layer {
  at::Tensor input_norm, qkv, qkv_bias, o, post_norm, gate_up, down;
};

// How one role's products are made this forward: the kernel and, for TRANSPOSED, the
// columns given to torch's GEMM (kernels.padded_rows).
struct Choice {
  int64_t kernel, padded;
};

// out [M, N] = x [M, K] @ w [N, K].T (+ bias)
void product(const float* x, int64_t M, const at::Tensor& w, const at::Tensor& bias,
             Choice choice, float* out) {
  const int64_t N = w.size(0), K = w.size(1);
  const float* wp = w.data_ptr<float>();
  if (choice.kernel == SMALL) {
    small_product(x, M, wp, N, K, out);
  } else {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    auto xt = at::from_blob(const_cast<float*>(x), {M, K}, opts);
    auto ot = at::from_blob(out, {M, N}, opts);
    if (choice.kernel == LINEAR) {
      ot.copy_(at::linear(xt, w));
    } else {  // W @ x.T, x padded with zero rows (see kernels.padded_rows)
      auto padded = at::zeros({std::max(choice.padded, M), K}, opts);
      padded.narrow(0, 0, M).copy_(xt);
      ot.copy_(at::mm(w, padded.t()).t().narrow(0, 0, M));
    }
  }
  if (bias.defined()) {
    const float* b = bias.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) out[m * N + n] += b[n];
  }
}

// out = weight * (x / sqrt(mean(x^2) + eps)), row by row (LLaMA's RMSNorm)
void rms_norm(const float* x, const float* weight, float eps, int64_t S, int64_t H, float* out) {
  const int64_t body = H - H % LANES;
  for (int64_t s = 0; s < S; ++s) {
    const float* row = x + s * H;
    vec16 acc{};
    for (int64_t h = 0; h < body; h += LANES) {
      const vec16 v = load16(row + h);
      acc += v * v;
    }
    float squares = lanes_sum(acc);
    for (int64_t h = body; h < H; ++h) squares += row[h] * row[h];
    const float scale = 1.0f / std::sqrt(squares / static_cast<float>(H) + eps);
    for (int64_t h = 0; h < H; ++h) out[s * H + h] = weight[h] * (row[h] * scale);
  }
}

// RoPE on the query and key heads of each row of the fused q/k/v output, in place:
// x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
void rotate(float* qkv, int64_t S, int64_t width, int64_t heads, int64_t D, const float* cos,
            const float* sin) {
  const int64_t half = D / 2;
  for (int64_t s = 0; s < S; ++s) {
    const float* c = cos + s * D;
    const float* n = sin + s * D;
    for (int64_t h = 0; h < heads; ++h) {
      float* x = qkv + s * width + h * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * c[i] + (-b) * n[i];
        x[i + half] = b * c[i + half] + a * n[i + half];
      }
    }
  }
}

// out = silu(gate) * up over rows [gate | up] of width 2 * I
void gated_silu(const float* gate_up, int64_t S, int64_t I, float* out) {
  const int64_t body = I - I % LANES;
  for (int64_t s = 0; s < S; ++s) {
    const float* gate = gate_up + s * 2 * I;
    const float* up = gate + I;
    float* row = out + s * I;
    for (int64_t i = 0; i < body; i += LANES) {
      const vec16 g = load16(gate + i);
      store16(row + i, g / (splat(1.0f) + exp16(-g)) * load16(up + i));
    }
    for (int64_t i = body; i < I; ++i) row[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

// One layer's attention over its cache, for the queries of one forward.
struct Attention {
  const float* qkv;  // [S, width]: queries, then keys, then values, per row
  int64_t width;
  const float* keys;    // [kv_heads, capacity, D]
  const float* values;  // [kv_heads, capacity, D]
  int64_t capacity, prefix, S, D, group;  // group: query heads per key/value head
  const uint8_t* mask;                    // per MaskMode; null for CAUSAL
  int64_t mask_mode, mask_width;
  float scale;
  float* out;  // [S, out_width]: each query head's D columns
  int64_t out_width;

  int64_t visible_end(int64_t s) const {  // keys at or past this are hidden from row s
    return mask_mode == CAUSAL ? prefix + s + 1 : prefix + S;
  }

  bool sees(int64_t s, int64_t t) const {
    if (mask_mode == CAUSAL) return t <= prefix + s;
    if (mask_mode == WHOLE) return mask[s * mask_width + t] != 0;
    return t < prefix || mask[s * mask_width + (t - prefix)] != 0;
  }

  // query rows m0 .. m1 of kv head g; row m is query head g * group + m / S at token m % S
  void run(int64_t g, int64_t m0, int64_t m1) const {
    const int64_t count = m1 - m0;
    int64_t end = 0;
    for (int64_t m = m0; m < m1; ++m) end = std::max(end, visible_end(m % S));
    const int64_t padded = (end + LANES - 1) / LANES * LANES;
    std::vector<float> query(count * D), scores(count * padded);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t m = m0 + i, head = g * group + m / S;
      std::memcpy(&query[i * D], qkv + (m % S) * width + head * D, D * sizeof(float));
    }
    small_rows(query.data(), count, keys + g * capacity * D, D, scores.data(), padded, 0, end);
    const float hidden = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t s = (m0 + i) % S;
      float* row = &scores[i * padded];
      float top = hidden;
      for (int64_t t = 0; t < padded; ++t) {
        row[t] = t < end && sees(s, t) ? row[t] * scale : hidden;
        top = std::max(top, row[t]);
      }
      for (int64_t t = 0; t < padded; t += LANES) {
        const vec16 v = load16(row + t);
        const vec16 p = exp16(v - splat(top));
        store16(row + t, v == splat(hidden) ? splat(0.0f) : p);
      }
    }
    // sum_t p[t] v[t] and sum_t p[t], keys in cache order (hidden ones add exact zeros)
    const int64_t chunks = D / LANES;
    const float* vbase = values + g * capacity * D;
    for (int64_t i = 0; i < count; ++i) {
      const float* p = &scores[i * padded];
      vec16 acc[8] = {};
      float total = 0.0f;
      for (int64_t t = 0; t < end; ++t) {
        const vec16 weight = splat(p[t]);
        for (int64_t c = 0; c < chunks; ++c) acc[c] += weight * load16(vbase + t * D + c * LANES);
        total += p[t];
      }
      const int64_t m = m0 + i, head = g * group + m / S;
      float* target = out + (m % S) * out_width + head * D;
      const vec16 inverse = splat(1.0f / total);
      for (int64_t c = 0; c < chunks; ++c) store16(target + c * LANES, acc[c] * inverse);
    }
  }
};

}  // namespace

class DecoderStack {
 public:
  // weights: seven tensors a layer (input norm, fused q/k/v, its bias or an empty tensor,
  // o, post-attention norm, fused gate/up, down), all float32 and contiguous
  DecoderStack(const std::vector<at::Tensor>& weights, int64_t q_heads, int64_t kv_heads,
               int64_t head_dim, double eps)
      : q_heads_(q_heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps) {
    TORCH_CHECK(weights.size() % 7 == 0, "DecoderStack: seven weights a layer");
    TORCH_CHECK(head_dim % LANES == 0 && head_dim <= 8 * LANES,
                "DecoderStack: head_dim must be a multiple of 16, at most 128");
    TORCH_CHECK(q_heads % kv_heads == 0, "DecoderStack: query heads per key/value head");
    for (size_t i = 0; i < weights.size(); i += 7) {
      // an empty bias tensor stands for none
      const at::Tensor bias = weights[i + 2].numel() ? weights[i + 2] : at::Tensor();
      Layer layer{weights[i],     weights[i + 1], bias,          weights[i + 3],
                  weights[i + 4], weights[i + 5], weights[i + 6]};
      for (const auto* w : {&layer.input_norm, &layer.qkv, &layer.o, &layer.post_norm,
                            &layer.gate_up, &layer.down})
        TORCH_CHECK(w->scalar_type() == at::kFloat && w->is_contiguous(),
                    "DecoderStack: float32 contiguous weights");
      layers_.push_back(std::move(layer));
    }
  }

  // hidden [S, H] is updated in place. Its rows are segments, one per sequence of a batch
  // (``rows`` each, in order); segment b attends only to its own cache: keys/values
  // [1, kv_heads, capacity, D] per layer, which receive its tokens' entries at
  // ``prefix[b][layer]`` (room already made), under its own mask and mask mode.
  // kernels: (kernel, padded columns) for the q/k/v, o, gate/up and down products.
  void forward(at::Tensor hidden, at::Tensor cos, at::Tensor sin,
               const std::vector<int64_t>& rows,
               const std::vector<std::vector<at::Tensor>>& keys,
               const std::vector<std::vector<at::Tensor>>& values,
               const std::vector<std::vector<int64_t>>& prefix, std::vector<at::Tensor> masks,
               const std::vector<int64_t>& mask_modes, const std::vector<bool>& skip_attention,
               const std::vector<bool>& skip_mlp, const std::vector<int64_t>& kernels,
               double scale) {
    const int64_t L = layers_.size(), S = hidden.size(0), H = hidden.size(1), D = head_dim_;
    TORCH_CHECK(hidden.is_contiguous() && hidden.scalar_type() == at::kFloat,
                "DecoderStack: hidden must be float32 [S, H], contiguous");
    const size_t B = rows.size();
    TORCH_CHECK(keys.size() == B && values.size() == B && prefix.size() == B &&
                    masks.size() == B && mask_modes.size() == B,
                "DecoderStack: one cache, prefix and mask a segment");
    int64_t total = 0;
    for (size_t b = 0; b < B; ++b) {
      TORCH_CHECK(static_cast<int64_t>(keys[b].size()) == L &&
                      static_cast<int64_t>(values[b].size()) == L &&
                      static_cast<int64_t>(prefix[b].size()) == L,
                  "DecoderStack: one entry a layer");
      if (masks[b].defined() && masks[b].numel() > 0)
        masks[b] = masks[b].to(at::kByte).contiguous();
      total += rows[b];
    }
    TORCH_CHECK(total == S, "DecoderStack: the segments' rows must add up to hidden's");
    TORCH_CHECK(static_cast<int64_t>(skip_attention.size()) == L &&
                    static_cast<int64_t>(skip_mlp.size()) == L && kernels.size() == 8,
                "DecoderStack: one entry a layer");
    cos = cos.contiguous();
    sin = sin.contiguous();
    const Choice qkv_k{kernels[0], kernels[1]}, o_k{kernels[2], kernels[3]},
        gate_up_k{kernels[4], kernels[5]}, down_k{kernels[6], kernels[7]};
    const int64_t width = (q_heads_ + 2 * kv_heads_) * D;
    const int64_t inner = layers_[0].down.size(1);
    auto opts = at::TensorOptions().dtype(at::kFloat);
    auto normed = at::empty({S, H}, opts), qkv = at::empty({S, width}, opts),
         attended = at::empty({S, q_heads_ * D}, opts), projected = at::empty({S, H}, opts),
         gate_up = at::empty({S, 2 * inner}, opts), gated = at::empty({S, inner}, opts);
    float* h = hidden.data_ptr<float>();
    FlushDenormals flushed;
    for (int64_t l = 0; l < L; ++l) {
      const Layer& w = layers_[l];
      if (!skip_attention[l]) {
        rms_norm(h, w.input_norm.data_ptr<float>(), eps_, S, H, normed.data_ptr<float>());
        product(normed.data_ptr<float>(), S, w.qkv, w.qkv_bias, qkv_k, qkv.data_ptr<float>());
        rotate(qkv.data_ptr<float>(), S, width, q_heads_ + kv_heads_, D, cos.data_ptr<float>(),
               sin.data_ptr<float>());
        attend(l, qkv.data_ptr<float>(), width, rows, keys, values, prefix, masks, mask_modes,
               static_cast<float>(scale), attended.data_ptr<float>());
        product(attended.data_ptr<float>(), S, w.o, at::Tensor(), o_k,
                projected.data_ptr<float>());
        add_into(h, projected.data_ptr<float>(), S * H);
      }
      if (!skip_mlp[l]) {
        rms_norm(h, w.post_norm.data_ptr<float>(), eps_, S, H, normed.data_ptr<float>());
        product(normed.data_ptr<float>(), S, w.gate_up, at::Tensor(), gate_up_k,
                gate_up.data_ptr<float>());
        gated_silu(gate_up.data_ptr<float>(), S, inner, gated.data_ptr<float>());
        product(gated.data_ptr<float>(), S, w.down, at::Tensor(), down_k,
                projected.data_ptr<float>());
        add_into(h, projected.data_ptr<float>(), S * H);
      }
    }
  }

 private:
  // Layer l's attention for every segment: each writes its keys and values into its own
  // cache and its queries see only that cache; one parallel loop over all their tasks.
  void attend(int64_t l, const float* qkv, int64_t width, const std::vector<int64_t>& rows,
              const std::vector<std::vector<at::Tensor>>& keys,
              const std::vector<std::vector<at::Tensor>>& values,
              const std::vector<std::vector<int64_t>>& prefix,
              const std::vector<at::Tensor>& masks, const std::vector<int64_t>& mask_modes,
              float scale, float* out) const {
    const int64_t D = head_dim_, group = q_heads_ / kv_heads_, out_width = q_heads_ * D;
    const int64_t k_col = q_heads_ * D, v_col = (q_heads_ + kv_heads_) * D;
    std::vector<Attention> jobs;
    std::vector<int64_t> first_task{0};  // segment b's tasks: first_task[b] .. first_task[b + 1]
    int64_t work = 0, row = 0;
    for (size_t b = 0; b < rows.size(); ++b) {
      const at::Tensor& k = keys[b][l];
      const at::Tensor& v = values[b][l];
      const int64_t S = rows[b], start = prefix[b][l], capacity = k.size(2);
      TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && start + S <= capacity,
                  "DecoderStack: the cache must be contiguous with room for the new tokens");
      float* kp = k.data_ptr<float>();
      float* vp = v.data_ptr<float>();
      const float* q = qkv + row * width;
      for (int64_t g = 0; g < kv_heads_; ++g)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t at = (g * capacity + start + s) * D;
          std::memcpy(kp + at, q + s * width + k_col + g * D, D * sizeof(float));
          std::memcpy(vp + at, q + s * width + v_col + g * D, D * sizeof(float));
        }
      const bool causal = mask_modes[b] == CAUSAL;
      jobs.push_back(Attention{q, width, kp, vp, capacity, start, S, D, group,
                               causal ? nullptr : masks[b].data_ptr<uint8_t>(), mask_modes[b],
                               causal ? 0 : masks[b].size(1), scale, out + row * out_width,
                               out_width});
      const int64_t blocks = (group * S + QUERY_BLOCK - 1) / QUERY_BLOCK;
      first_task.push_back(first_task.back() + kv_heads_ * blocks);
      work += 2 * group * S * kv_heads_ * (start + S) * D;
      row += S;
    }
    const int64_t tasks = first_task.back();
    at::parallel_for(0, tasks, work < INLINE_WORK ? tasks : 1, [&](int64_t t0, int64_t t1) {
      FlushDenormals flushed;
      size_t b = 0;
      for (int64_t t = t0; t < t1; ++t) {
        while (t >= first_task[b + 1]) ++b;
        const Attention& job = jobs[b];
        const int64_t local = t - first_task[b], job_rows = group * job.S;
        const int64_t blocks = (job_rows + QUERY_BLOCK - 1) / QUERY_BLOCK;
        const int64_t g = local / blocks, m0 = (local % blocks) * QUERY_BLOCK;
        job.run(g, m0, std::min(job_rows, m0 + QUERY_BLOCK));
      }
    });
  }

  std::vector<Layer> layers_;
  int64_t q_heads_, kv_heads_, head_dim_;
  float eps_;
};

}  // namespace autotune

namespace autotune {
void bind_decoder(pybind11::module& m) {
  pybind11::class_<DecoderStack>(m, "DecoderStack")
      .def(pybind11::init<const std::vector<at::Tensor>&, int64_t, int64_t, int64_t, double>())
      // other Python threads (progress bars, a trial worker's heartbeat) run meanwhile
      .def("forward", &DecoderStack::forward,
           pybind11::call_guard<pybind11::gil_scoped_release>());
}
}  // namespace autotune
