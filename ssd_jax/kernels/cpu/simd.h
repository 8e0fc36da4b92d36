// Vector helpers shared by the C++ CPU kernels: one vector type per build, explicit FMA, one reduction tree.
//
// What a kernel computes must follow from its source alone, not from the optimiser's choices for one template
// instance or one -mtune: the few-row products promise that a row's result does not depend on how many rows share
// the call, and the attention that a query's output does not depend on the other queries beside it. So every
// multiply-add goes through Fma() and every horizontal sum through HSum(), and the kernels are built with
// -ffp-contract=off (cpu_ffi.py).
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__FMA__) || defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace ssd_simd {

#if defined(__AVX512F__)
#define SSD_VW 16  // floats per vector register
constexpr int kRegs = 32;
#else
#define SSD_VW 8
constexpr int kRegs = 16;
#endif
constexpr int kW = SSD_VW;
typedef float vf __attribute__((vector_size(SSD_VW * sizeof(float))));

inline vf Load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void Store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

inline vf Splat(float a) { return vf{} + a; }

// c + a * b, fused where the instruction set has FMA (one rounding), else multiply then add (two): decided here, at
// compile time, for every use. The kernels never write a * b + c themselves (and are built with -ffp-contract=off),
// so the optimiser cannot fuse some multiply-adds and not others.
inline vf Fma(vf a, vf b, vf c) {
#if SSD_VW == 16
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#elif defined(__ARM_FEATURE_FMA)
  vf r;
  for (int i = 0; i < SSD_VW; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#else
  return c + a * b;
#endif
}

inline float Fma(float a, float b, float c) {
#if defined(__FMA__) || defined(__AVX512F__) || defined(__ARM_FEATURE_FMA)
  return __builtin_fmaf(a, b, c);
#else
  return c + a * b;
#endif
}

// The one reduction tree every dot product ends with: halves added pairwise down to one lane.
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
inline float HSum(vf v) {
#if SSD_VW == 16
  const vf8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const vf8 h = v;
#endif
  const vf4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  const float a = q[0] + q[2], b = q[1] + q[3];
  return a + b;
}

// out[j] = HSum(v[j]) for 16 vectors, bit for bit (each sum is HSum's tree: halves pairwise down to one lane), but
// the 16 sums are formed together, lanes of several vectors shuffled into one at each level, instead of one at a time.
inline void HSum16(const vf* v, float* out) {
#if SSD_VW == 16
  vf u[8], w[4], x[2];
  for (int p = 0; p < 8; ++p)  // lanes 0-7: v[2p]'s halves added, lanes 8-15: v[2p+1]'s
    u[p] = __builtin_shufflevector(v[2 * p], v[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * p], v[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                   31);
  for (int p = 0; p < 4; ++p)  // 4 lanes per vector: quarters added
    w[p] = __builtin_shufflevector(u[2 * p], u[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(u[2 * p], u[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int p = 0; p < 2; ++p)  // 2 lanes per vector: a = q[0] + q[2], b = q[1] + q[3]
    x[p] = __builtin_shufflevector(w[2 * p], w[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(w[2 * p], w[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  Store(out, __builtin_shufflevector(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
                 __builtin_shufflevector(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
#else
  for (int g = 0; g < 2; ++g) {
    const vf* vg = v + 8 * g;
    vf u[4], w[2];
    for (int p = 0; p < 4; ++p)  // lanes 0-3: vg[2p]'s halves added, lanes 4-7: vg[2p+1]'s
      u[p] = __builtin_shufflevector(vg[2 * p], vg[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
             __builtin_shufflevector(vg[2 * p], vg[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int p = 0; p < 2; ++p)  // 2 lanes per vector: a = q[0] + q[2], b = q[1] + q[3]
      w[p] = __builtin_shufflevector(u[2 * p], u[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
             __builtin_shufflevector(u[2 * p], u[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    Store(out + 8 * g, __builtin_shufflevector(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14) +
                           __builtin_shufflevector(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15));
  }
#endif
}

// exp(x) by mul and add only (never a fused multiply-add, whatever the instruction set), so the AVX-512, AVX2, SSE2
// and scalar forms below give the same bits: x = n ln2 + r with n = round(x / ln2) (by adding 1.5 * 2^23), ln2 in
// two parts (the first exact in n * ln2_hi), then exp(r) for |r| <= ln2 / 2 by its Taylor series to r^7 (truncation
// below 0.05 ulp), then times 2^n built in the exponent bits. Within 2 ulp of exp for -87.33 <= x <= 88; below
// ln(FLT_MIN) = -87.34 (the denormal range) it gives 0 and above 88 it gives exp(88). Softmax weights use x <= 0.
namespace exp_detail {
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440054690583e-4f;
constexpr float kRound = 12582912.f;  // 1.5 * 2^23: x + kRound rounds x to an integer, held in the low bits
constexpr float kLo = -87.3365402f, kHi = 88.f;
constexpr float kC[8] = {1.f, 1.f, 1.f / 2, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720, 1.f / 5040};
constexpr int32_t kRoundBits = 0x4b400000;  // the bits of kRound
}  // namespace exp_detail

typedef int32_t vi __attribute__((vector_size(SSD_VW * sizeof(int32_t))));

inline vf Exp(vf x) {
  using namespace exp_detail;
  const vi zero = x < Splat(kLo);  // lanes of -1 where the result is 0
  x = x < Splat(kLo) ? Splat(kLo) : x;
  x = x > Splat(kHi) ? Splat(kHi) : x;
  const vf t = x * kLog2e + kRound;
  const vf n = t - kRound;
  const vf r = (x - n * kLn2Hi) - n * kLn2Lo;
  vf p = Splat(kC[7]);
  for (int i = 6; i >= 2; --i) p = p * r + kC[i];
  p = (r + (r * r) * p) + 1.f;
  const vi pow2 = (((vi)t - kRoundBits) + 127) << 23;
  return (vf)((vi)(p * (vf)pow2) & ~zero);
}

inline float Exp(float x) {
  using namespace exp_detail;
  const bool zero = x < kLo;
  x = x < kLo ? kLo : x;
  x = x > kHi ? kHi : x;
  const float t = x * kLog2e + kRound;
  const float n = t - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = kC[7];
  for (int i = 6; i >= 2; --i) p = p * r + kC[i];
  p = (r + (r * r) * p) + 1.f;
  int32_t tb, pow2;
  std::memcpy(&tb, &t, sizeof(tb));
  pow2 = ((tb - kRoundBits) + 127) << 23;
  float scale;
  std::memcpy(&scale, &pow2, sizeof(scale));
  return zero ? 0.f : p * scale;
}

}  // namespace ssd_simd
