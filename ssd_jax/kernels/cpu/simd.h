// Vector helpers shared by the C++ CPU kernels: one vector type per build, explicit FMA, one reduction tree.
//
// What a kernel computes must follow from its source alone, not from the optimiser's choices for one template
// instance or one -mtune: the few-row products promise that a row's result does not depend on how many rows share
// the call, and the attention that a query's output does not depend on the other queries beside it. So every
// multiply-add goes through Fma() and every horizontal sum through HSum(), and the kernels are built with
// -ffp-contract=off (cpu_ffi.py).
#pragma once

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

}  // namespace ssd_simd
