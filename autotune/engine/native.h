// Shared by the engine's C++ sources (built together by autotune.engine.native).
#pragma once

#include <cstdint>
#include <cstring>

namespace autotune {

// 16 floats: one AVX-512 register (two AVX2 registers on CPUs without AVX-512)
typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));
static constexpr int LANES = 16;

static inline vec16 load16(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static inline void store16(float* p, vec16 v) { std::memcpy(p, &v, sizeof v); }

typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));

// The sum of a vector's lanes, halves added in one fixed order: a row's result never
// depends on how many rows share its product, so a verify pass gives each token the logits
// a one-token step gives it.
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

// out[m * ldo + n] = sum_k x[m * K + k] * w[n * K + k] for m < M and n0 <= n < n1, on the
// calling thread. Each output is the same bits whatever M, n0 and n1 are: a row of a
// verify pass gets exactly what a one-row step gets.
void small_rows(const float* x, int64_t M, const float* w, int64_t K, float* out, int64_t ldo,
                int64_t n0, int64_t n1);

// out [M, N] = x [M, K] @ w [N, K].T, the weight's rows shared among torch's threads.
void small_product(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* out);

// Subnormal floats count as zero while an instance lives on this thread (restored after):
// activations near zero made one verify pass take 2 s instead of 30 ms.
class FlushDenormals {
 public:
  FlushDenormals();
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned int saved_;
};

}  // namespace autotune
