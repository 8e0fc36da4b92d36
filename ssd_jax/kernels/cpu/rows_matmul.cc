// Few-row matrix products for XLA:CPU that stream the weights once.
//
// XLA:CPU sends a product with a few rows (2..16) through a GEMM that packs the whole weight matrix first, which
// costs 2-3x a one-row product although the weights come from memory either way. These kernels read each weight
// row once, contiguously, and apply it to all M input rows while it is in cache. The row count is a template
// parameter so the M accumulators live in registers.
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float hsum(v8 v) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

// Threads for one call: the cores the calling thread may use now (libgomp reads its affinity on each call). When
// the process is pinned to one core (SSD's split placement), the kernels then run on one thread instead of making
// OpenMP threads take turns on that core.
int Threads() {
  const int n = omp_get_num_procs();
  return n < 1 ? 1 : n;
}

int64_t Rows(const ffi::Buffer<ffi::F32>& x) {
  auto d = x.dimensions();
  int64_t m = 1;
  for (size_t i = 0; i + 1 < d.size(); ++i) m *= d[i];
  return m;
}

// y[m, n] = dot(x[m, :], e[n, :]) for n in [n0, n1): each e row is read once for all M rows.
template <int M>
void DotRows(const float* X, const float* E, float* Y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t k8 = K & ~int64_t(7);
  for (int64_t n = n0; n < n1; ++n) {
    const float* er = E + n * K;
    v8 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = v8{};
    for (int64_t k = 0; k < k8; k += 8) {
      const v8 e = load8(er + k);
      for (int m = 0; m < M; ++m) acc[m] += load8(X + m * K + k) * e;
    }
    for (int m = 0; m < M; ++m) {
      float s = hsum(acc[m]);
      for (int64_t k = k8; k < K; ++k) s += X[m * K + k] * er[k];
      Y[m * N + n] = s;
    }
  }
}

// y[m, :] += x[m, k] * w[k, :] for k in [k0, k1): each w row is read once, contiguously, for all M rows. From 4 rows
// on, four w rows are applied per pass over y, so y (M rows of N, soon larger than L1) is loaded and stored a
// quarter as often (measured 10-30% faster at 4-8 rows on the 2-core CPU, level below 4). Each y element still adds
// its terms one k at a time, in k order (the build keeps the source's association), so a row's result is the same
// bit for bit whatever the row count.
// Applies w rows k .. k+KU-1 to every y row in one pass over y.
template <int M, int KU>
inline void AxpyStep(const float* X, const float* W, float* Y, int64_t K, int64_t N, int64_t k) {
  const int64_t n8 = N & ~int64_t(7);
  const float* wr = W + k * N;
  float a[M][KU];
  for (int m = 0; m < M; ++m)
    for (int q = 0; q < KU; ++q) a[m][q] = X[m * K + k + q];
  for (int64_t n = 0; n < n8; n += 8) {
    v8 w[KU];
    for (int q = 0; q < KU; ++q) w[q] = load8(wr + q * N + n);
    for (int m = 0; m < M; ++m) {
      v8 y = load8(Y + m * N + n);
      for (int q = 0; q < KU; ++q) y += a[m][q] * w[q];
      std::memcpy(Y + m * N + n, &y, sizeof(y));
    }
  }
  for (int64_t n = n8; n < N; ++n)
    for (int m = 0; m < M; ++m)
      for (int q = 0; q < KU; ++q) Y[m * N + n] += a[m][q] * wr[q * N + n];
}

template <int M>
void AxpyRows(const float* X, const float* W, float* Y, int64_t K, int64_t N, int64_t k0, int64_t k1) {
  constexpr int KU = M >= 4 ? 4 : 1;
  int64_t k = k0;
  for (; KU > 1 && k + KU <= k1; k += KU) AxpyStep<M, KU>(X, W, Y, K, N, k);
  for (; k < k1; ++k) AxpyStep<M, 1>(X, W, Y, K, N, k);
}


#define SSD_ROWS_CASES(fn, ...)                       \
  switch (M) {                                        \
    case 1: fn<1>(__VA_ARGS__); break;                \
    case 2: fn<2>(__VA_ARGS__); break;                \
    case 3: fn<3>(__VA_ARGS__); break;                \
    case 4: fn<4>(__VA_ARGS__); break;                \
    case 5: fn<5>(__VA_ARGS__); break;                \
    case 6: fn<6>(__VA_ARGS__); break;                \
    case 7: fn<7>(__VA_ARGS__); break;                \
    case 8: fn<8>(__VA_ARGS__); break;                \
    case 9: fn<9>(__VA_ARGS__); break;                \
    case 10: fn<10>(__VA_ARGS__); break;              \
    case 11: fn<11>(__VA_ARGS__); break;              \
    case 12: fn<12>(__VA_ARGS__); break;              \
    case 13: fn<13>(__VA_ARGS__); break;              \
    case 14: fn<14>(__VA_ARGS__); break;              \
    case 15: fn<15>(__VA_ARGS__); break;              \
    default: fn<16>(__VA_ARGS__); break;              \
  }

// y[M, N] = x[M, K] @ e[N, K]^T  (weights stored [out, in], e.g. a tied embedding [V, d] as the LM head).
ffi::Error RowsMatmulTImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> e, ffi::ResultBuffer<ffi::F32> y) {
  auto ed = e.dimensions();
  if (ed.size() != 2) return ffi::Error::InvalidArgument("weights must be 2-D");
  const int64_t N = ed[0], K = ed[1], M = Rows(x);
  const float* X = x.typed_data();
  const float* E = e.typed_data();
  float* Y = y->typed_data();
  if (M > 16) return ffi::Error::InvalidArgument("at most 16 rows");
  constexpr int64_t NB = 1024;
#pragma omp parallel for schedule(static) num_threads(Threads())
  for (int64_t n0 = 0; n0 < N; n0 += NB) {
    const int64_t n1 = (n0 + NB < N) ? n0 + NB : N;
    SSD_ROWS_CASES(DotRows, X, E, Y, K, N, n0, n1)
  }
  return ffi::Error::Success();
}

// y[M, N] = x[M, K] @ w[K, N]  (weights stored [in, out]). Threads split K (contiguous halves of w) and sum.
ffi::Error RowsMatmulImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  auto wd = w.dimensions();
  if (wd.size() != 2) return ffi::Error::InvalidArgument("weights must be 2-D");
  const int64_t K = wd[0], N = wd[1], M = Rows(x);
  if (M > 16) return ffi::Error::InvalidArgument("at most 16 rows");
  const float* X = x.typed_data();
  const float* W = w.typed_data();
  float* Y = y->typed_data();
  std::memset(Y, 0, sizeof(float) * M * N);
  constexpr int kParts = 2;
  std::vector<float> part(static_cast<size_t>(M * N), 0.f);
  const int threads = Threads() < kParts ? Threads() : kParts;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int p = 0; p < kParts; ++p) {
    const int64_t k0 = K * p / kParts, k1 = K * (p + 1) / kParts;
    float* dst = p == 0 ? Y : part.data();
    SSD_ROWS_CASES(AxpyRows, X, W, dst, K, N, k0, k1)
  }
  for (int64_t i = 0; i < M * N; ++i) Y[i] += part[i];
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsMatmul, RowsMatmulImpl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsMatmulT, RowsMatmulTImpl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
