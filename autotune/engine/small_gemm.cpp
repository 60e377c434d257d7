// x [M, K] @ w[N, K].T in float32 for the few rows (M <= 64) of a decode or verify step.
//
// torch's CPU kernels re-pack the whole weight on every call once M passes 2 or so, so a
// verify over 8 tokens cost 2.1x one token on a 2-core Xeon where the weight stream alone
// costs the same for both. Here each weight row is read from memory once per call and
// multiplied against every row of x while it is in registers; the next rows are prefetched
// while the current ones are used. Built by autotune.engine.native for this machine.
// ATen's headers, not torch/extension.h: each source compiles in a few seconds, not 15
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "native.h"

namespace autotune {

static constexpr int MC = 8;          // rows of x per register block
// weight rows per parallel task: a multiple of every block height but 5 and 7, that splits
// the common widths (576, 960, 3072, 4096, ...) evenly between 2 threads (64 left one thread
// 5 of the 9 tasks of a 576-row weight)
static constexpr int64_t TASK = 48;

FlushDenormals::FlushDenormals() : saved_(0) {
#if defined(__SSE__)
  saved_ = _mm_getcsr();
  _mm_setcsr(saved_ | 0x8040);  // flush-to-zero and denormals-are-zero
#endif
}

FlushDenormals::~FlushDenormals() {
#if defined(__SSE__)
  _mm_setcsr(saved_);
#endif
}

// out[m, n0 + r] for m < M, r < R: R weight rows against M rows of x, over all of K
template <int M, int R>
static void block(const float* x, const float* w, float* out, int64_t K, int64_t ldo,
                  int64_t n0) {
  vec16 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = vec16{};
  const int64_t body = K - K % LANES;
  for (int64_t k = 0; k < body; k += LANES) {
    vec16 wv[R];
    for (int r = 0; r < R; ++r) {
      // One row of x streams the weight at the memory's pace, which the hardware
      // prefetchers keep up with (prefetch instructions only slowed it: 6.9 -> 7.8 ms
      // for SmolLM2-135M's products on 2 cores). More rows compute long enough between
      // loads that the weight must be asked for ahead: the next block's rows into L1,
      // and from 5 rows on those three blocks ahead into L2 as well (L1 holds too few
      // pending misses to stream at full bandwidth: 8 rows 18.0 -> 16.7 ms).
      if (M > 1) __builtin_prefetch(w + (n0 + R + r) * K + k);
      if (M > 4) __builtin_prefetch(w + (n0 + 3 * R + r) * K + k, 0, 1);
      wv[r] = load16(w + (n0 + r) * K + k);
    }
    for (int m = 0; m < M; ++m) {
      const vec16 xv = load16(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] += wv[r] * xv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = lanes_sum(acc[r][m]);
      for (int64_t k = body; k < K; ++k) s += w[(n0 + r) * K + k] * x[m * K + k];
      out[m * ldo + n0 + r] = s;
    }
}

// R as large as the 32 vector registers allow beside M accumulators per weight row
template <int M>
static void rows(const float* x, const float* w, float* out, int64_t K, int64_t ldo, int64_t n0,
                 int64_t n1) {
  constexpr int R = M <= 2 ? 8 : M == 3 ? 7 : M == 4 ? 6 : M == 5 ? 5 : M == 6 ? 4 : 3;
  int64_t n = n0;
  for (; n + R <= n1; n += R) block<M, R>(x, w, out, K, ldo, n);
  for (; n < n1; ++n) block<M, 1>(x, w, out, K, ldo, n);
}

typedef void (*RowsFn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
static const RowsFn ROWS[MC + 1] = {nullptr, rows<1>, rows<2>, rows<3>, rows<4>,
                                    rows<5>, rows<6>, rows<7>, rows<8>};

void small_rows(const float* x, int64_t M, const float* w, int64_t K, float* out, int64_t ldo,
                int64_t n0, int64_t n1) {
  // more than MC rows: MC at a time, each pass over these weight rows (in the cache after
  // the first pass)
  for (int64_t m0 = 0; m0 < M; m0 += MC) {
    const int64_t count = std::min<int64_t>(MC, M - m0);
    ROWS[count](x + m0 * K, w, out + m0 * ldo, K, ldo, n0, n1);
  }
}

void small_product(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* out) {
  at::parallel_for(0, (N + TASK - 1) / TASK, 1, [&](int64_t t0, int64_t t1) {
    FlushDenormals flushed;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * TASK;
      small_rows(x, M, w, K, out, N, n0, std::min(N, n0 + TASK));
    }
  });
}

at::Tensor small_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "small_linear: float32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "small_linear: x [M, K] and w [N, K]");
  TORCH_CHECK(w.is_contiguous(), "small_linear: the weight must be contiguous");
  x = x.contiguous();
  auto out = at::empty({x.size(0), w.size(0)}, x.options());
  small_product(x.data_ptr<float>(), x.size(0), w.data_ptr<float>(), w.size(0), x.size(1),
                out.data_ptr<float>());
  return out;
}

}  // namespace autotune
