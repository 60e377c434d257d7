// x [M, K] @ w[N, K].T in float32 for the few rows (M <= 64) of a decode or verify step.
//
// torch's CPU kernels re-pack the whole weight on every call once M passes 2 or so, so a
// verify over 8 tokens cost 2.1x one token on a 2-core Xeon where the weight stream alone
// costs the same for both. Here each weight row is read from memory once per call and
// multiplied against every row of x while it is in registers; the next rows are prefetched
// while the current ones are used. Built by autotune.engine.small_gemm for this machine.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

// 16 floats: one AVX-512 register (two AVX2 registers on CPUs without AVX-512)
typedef float vec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));
static constexpr int LANES = 16;
static constexpr int MC = 8;          // rows of x per register block
static constexpr int64_t TASK = 64;   // weight rows per parallel task

static inline vec16 load(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Halves added in one fixed order: a row's result never depends on how many rows share its
// product, so a verify pass gives each token the logits a one-token step gives it.
static inline float lanes_sum(vec16 v) {
  vec8 lo, hi;
  std::memcpy(&lo, &v, 32);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + 32, 32);
  const vec8 s8 = lo + hi;
  vec4 a, b;
  std::memcpy(&a, &s8, 16);
  std::memcpy(&b, reinterpret_cast<const char*>(&s8) + 16, 16);
  const vec4 s4 = a + b;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// out[m, n0 + r] for m < M, r < R: R weight rows against M rows of x, over all of K
template <int M, int R>
static void block(const float* x, const float* w, float* out, int64_t K, int64_t N, int64_t n0) {
  vec16 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = vec16{};
  const int64_t body = K - K % LANES;
  for (int64_t k = 0; k < body; k += LANES) {
    vec16 wv[R];
    for (int r = 0; r < R; ++r) {
      // the next block's rows, one block ahead: memory latency hidden behind this block
      __builtin_prefetch(w + (n0 + R + r) * K + k);
      wv[r] = load(w + (n0 + r) * K + k);
    }
    for (int m = 0; m < M; ++m) {
      const vec16 xv = load(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] += wv[r] * xv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = lanes_sum(acc[r][m]);
      for (int64_t k = body; k < K; ++k) s += w[(n0 + r) * K + k] * x[m * K + k];
      out[m * N + n0 + r] = s;
    }
}

// R as large as the 32 vector registers allow beside M accumulators per weight row
template <int M>
static void rows(const float* x, const float* w, float* out, int64_t K, int64_t N, int64_t n0,
                 int64_t n1) {
  constexpr int R = M <= 2 ? 8 : M == 3 ? 7 : M == 4 ? 6 : M == 5 ? 5 : M == 6 ? 4 : 3;
  int64_t n = n0;
  for (; n + R <= n1; n += R) block<M, R>(x, w, out, K, N, n);
  for (; n < n1; ++n) block<M, 1>(x, w, out, K, N, n);
}

typedef void (*RowsFn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
static const RowsFn ROWS[MC + 1] = {nullptr, rows<1>, rows<2>, rows<3>, rows<4>,
                                    rows<5>, rows<6>, rows<7>, rows<8>};

torch::Tensor small_linear(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32,
              "small_linear: float32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "small_linear: x [M, K] and w [N, K]");
  TORCH_CHECK(w.is_contiguous(), "small_linear: the weight must be contiguous");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, (N + TASK - 1) / TASK, 1, [&](int64_t t0, int64_t t1) {
#if defined(__SSE__)
    // subnormal inputs (activations near zero) made one verify pass take 2 s instead of
    // 30 ms; as torch's own kernels do, they count as zero here (flags restored after)
    const unsigned int mxcsr = _mm_getcsr();
    _mm_setcsr(mxcsr | 0x8040);  // flush-to-zero and denormals-are-zero
#endif
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * TASK, n1 = std::min(N, n0 + TASK);
      // more than MC rows: MC at a time, each pass over this task's weight rows (in the
      // cache after the first pass)
      for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t count = std::min<int64_t>(MC, M - m0);
        ROWS[count](xp + m0 * K, wp, op + m0 * N, K, N, n0, n1);
      }
    }
#if defined(__SSE__)
    _mm_setcsr(mxcsr);
#endif
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "x @ w.T for a few rows of x (float32)");
}
