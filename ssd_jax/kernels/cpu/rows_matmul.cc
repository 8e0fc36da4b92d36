// Few-row matrix products for XLA:CPU that stream the weights once. Weights in float32, in bfloat16 or in GGUF blocks
// (Q8_0, Q4_1; the dot form only), widened to float32 in registers; activations and sums are float32.
//
// A verify multiplies T = K+1 <= ~9 rows by every weight matrix. XLA:CPU sends such a product through a GEMM that
// packs the whole weight matrix first, and its one-row product is a matrix-vector loop; either way the weights come
// from memory once, so a T-row product should cost about what a one-row product costs. These kernels read each
// weight element once for all M rows and keep the M x (a few vectors) partial sums in registers: the row count is
// a template parameter, and every M up to 9 has its own register blocking (no row count handled worse than a larger
// one; M 10..12 use a narrower block). More rows (a batch's verify) go in tiles of at most 8 over cached chunks.
//
// Exactness across row counts: a row's result must not depend on how many other rows share the call (a verify row
// then gets bit for bit what the same row gets alone). Every output element is built the same way whatever M and
// whatever block it falls in: products added one k at a time in k order, per panel of kPanel weight rows, panels
// added to the output in k order; the dot form ends with the same fixed reduction tree. Each multiply-add is written
// out as Fma() (simd.h): fused wherever the instruction set has FMA, a rounded multiply then an add where it has not.
// The build forbids the compiler both reassociation and contraction (cpu_ffi.py: -ffp-contract=off), so no template
// instance or -mtune can choose differently: GCC's Zen tuning, for one, leaves some multiply-add chains unfused,
// which made rows differ between row counts on an AVX2 EPYC when contraction was left to the optimiser.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "parallel.h"
#include "simd.h"

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace ssd_simd;  // NOLINT: the kernels' vocabulary (vf, kW, Load, Fma, HSum)

int64_t Rows(const ffi::Buffer<ffi::F32>& x) {
  auto d = x.dimensions();
  int64_t m = 1;
  for (size_t i = 0; i + 1 < d.size(); ++i) m *= d[i];
  return m;
}

// ---- y[M, N] = x[M, K] @ w[K, N] (weights stored [in, out]) ----
//
// The weights are walked in panels of kPanel rows: for each block of columns the panel's rows are applied in k
// order to M x NB vector accumulators, which are then added to y. Inside a panel the kPanel rows are read as
// kPanel sequential streams (the prefetchers follow them), each element once; y (M rows of N) stays in L1/L2.
constexpr int64_t kPanel = 16;
// Prefetch distances, tuned on a 2-core Xeon (AVX-512) over a whole model's weights (30 layers and a 49,152-row
// head, cold in cache): [in, out] weights one panel ahead; [out, in] weights two row blocks ahead. Registers left
// beside the accumulators: fewer accumulators than the registers allow measured 2-5% faster at 5-9 rows.
constexpr int64_t kPrefetchPanels = 1;
constexpr int64_t kDotPrefetchBlocks = 2;
constexpr int kSpareRegs = 5;

// Weights are float32 or bfloat16 (Bf16: its bits); a bfloat16 weight widens to float exactly (its bits shifted up).
struct Bf16 {
  uint16_t bits;
};
inline float ToF(float w) { return w; }
inline float ToF(Bf16 w) {
  const uint32_t u = static_cast<uint32_t>(w.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline vf LoadW(const float* p) { return Load(p); }
inline vf LoadW(const Bf16* p) {
#if SSD_VW == 16
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return reinterpret_cast<vf>(_mm512_slli_epi32(v, 16));
#elif defined(__AVX2__)
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return reinterpret_cast<vf>(_mm256_slli_epi32(v, 16));
#else
  vf r;
  for (int i = 0; i < kW; ++i) r[i] = ToF(p[i]);
  return r;
#endif
}

// Vectors per column block for M rows: as wide as the registers allow (M * NB accumulators, NB weight vectors and
// a broadcast).
template <int M>
constexpr int ColVecs() {
  constexpr int nb = (kRegs - kSpareRegs) / (M + 1);
  return nb < 1 ? 1 : (nb > 8 ? 8 : nb);
}

// Columns [n, n + NB * kW) of y for weight rows [k0, k1).
template <int M, int NB, typename T>
inline void PanelBlock(const float* X, const T* W, float* Y, int64_t K, int64_t N, int64_t k0, int64_t k1,
                       int64_t n, bool first) {
  // The same columns kPrefetchPanels panels on, into L2, one row per k step (spread out, so the prefetches never
  // queue up behind each other): a panel's rows are short streams that the hardware prefetchers barely ramp up on,
  // and from a few rows on the arithmetic no longer hides the memory latency by itself.
  const int64_t pd = kPrefetchPanels * kPanel;
  vf acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = vf{};
  for (int64_t k = k0; k < k1; ++k) {
    const T* wr = W + k * N + n;
    vf w[NB];
    for (int j = 0; j < NB; ++j) w[j] = LoadW(wr + j * kW);
    if (k + pd < K)
      for (int j = 0; j < NB * kW; j += 16) __builtin_prefetch(wr + pd * N + j, 0, 2);
    for (int m = 0; m < M; ++m) {
      const vf a = Splat(X[m * K + k]);
      for (int j = 0; j < NB; ++j) acc[m][j] = Fma(a, w[j], acc[m][j]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NB; ++j) {
      float* y = Y + m * N + n + j * kW;
      Store(y, first ? acc[m][j] : Load(y) + acc[m][j]);
    }
}

// Columns [n, n1) (fewer than a vector): the same sums, one column at a time.
template <int M, typename T>
inline void PanelTail(const float* X, const T* W, float* Y, int64_t K, int64_t N, int64_t k0, int64_t k1,
                      int64_t n, int64_t n1, bool first) {
  for (; n < n1; ++n)
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
      for (int64_t k = k0; k < k1; ++k) s = Fma(X[m * K + k], ToF(W[k * N + n]), s);
      Y[m * N + n] = first ? s : Y[m * N + n] + s;
    }
}

// y columns [n0, n1) (n0 a multiple of kW; n1 one too, or N).
template <int M, typename T>
void AxpyRows(const float* X, const T* W, float* Y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  constexpr int NB = ColVecs<M>();
  for (int64_t k0 = 0; k0 < K; k0 += kPanel) {
    const int64_t k1 = k0 + kPanel < K ? k0 + kPanel : K;
    const bool first = k0 == 0;
    int64_t n = n0;
    for (; n + NB * kW <= n1; n += NB * kW) PanelBlock<M, NB, T>(X, W, Y, K, N, k0, k1, n, first);
    for (; n + kW <= n1; n += kW) PanelBlock<M, 1, T>(X, W, Y, K, N, k0, k1, n, first);
    PanelTail<M, T>(X, W, Y, K, N, k0, k1, n, n1, first);
  }
}

// ---- y[M, N] = x[M, K] @ e[N, K]^T (weights stored [out, in], e.g. a tied embedding [V, d] as the LM head) ----
//
// NR weight rows at a time, each read once, sequentially, against the M input rows (in L1): M x NR vector
// accumulators over k, then the fixed reduction tree, then the k tail in order.
template <int M>
constexpr int DotRowsPerBlock() {
  constexpr int nr = (kRegs - kSpareRegs) / (M + 1);
  return nr < 1 ? 1 : (nr > 6 ? 6 : nr);
}

template <int M, int NR, typename T>
inline void DotBlock(const float* X, const T* E, float* Y, int64_t K, int64_t N, int64_t n) {
  const int64_t kv = K - K % kW;
  vf acc[M][NR];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = vf{};
  for (int64_t k = 0; k < kv; k += kW) {
    vf e[NR];
    for (int r = 0; r < NR; ++r) e[r] = LoadW(E + (n + r) * K + k);
    // Rows two blocks on, into L2: with many rows the arithmetic per weight byte outruns the hardware prefetcher.
    if (n + (kDotPrefetchBlocks + 1) * NR <= N)
      for (int r = 0; r < NR; ++r) __builtin_prefetch(E + (n + kDotPrefetchBlocks * NR + r) * K + k, 0, 2);
    for (int m = 0; m < M; ++m) {
      const vf x = Load(X + m * K + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = Fma(x, e[r], acc[m][r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < NR; ++r) {
      float s = HSum(acc[m][r]), t = 0.f;
      for (int64_t k = kv; k < K; ++k) t = Fma(X[m * K + k], ToF(E[(n + r) * K + k]), t);
      Y[m * N + n + r] = s + t;
    }
}

// y columns [n0, n1).
template <int M, typename T>
void DotRows(const float* X, const T* E, float* Y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  constexpr int NR = DotRowsPerBlock<M>();
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) DotBlock<M, NR, T>(X, E, Y, K, N, n);
  for (; n < n1; ++n) DotBlock<M, 1, T>(X, E, Y, K, N, n);
}

#define SSD_ROWS_CASES(rows, fn, ...)                 \
  switch (rows) {                                     \
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

// More than kSingleBlockRows rows (a batch's verify: B x (K+1) rows): tiles of at most kTileRows rows, as even as possible (8 keeps
// three accumulator vectors a row, so each broadcast row value feeds three FMAs; a 16-row block feeds one), each run over a chunk of columns whose weights (about kChunkBytes) stay in L2 while the next
// tile reads them again. Every output element is still built exactly as a tile of its own would build it, so any
// row count gives each row what it gets alone.
constexpr int64_t kTileRows = 8;
// Up to this many rows one register block is faster (interleaved A/B on the 2-core Xeon: one block 0.77x tiles at
// 12 rows, tiles 0.91-0.95x one block at 13 and 16).
constexpr int64_t kSingleBlockRows = 12;
constexpr int64_t kChunkBytes = 1 << 20;

template <typename F>
void Tiled(int64_t M, int64_t n0, int64_t n1, int64_t chunk, F&& run) {
  if (M <= kSingleBlockRows) {
    run(0, M, n0, n1);
    return;
  }
  const int64_t tiles = (M + kTileRows - 1) / kTileRows;
  for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
    const int64_t c1 = c0 + chunk < n1 ? c0 + chunk : n1;
    for (int64_t t = 0; t < tiles; ++t) run(M * t / tiles, M * (t + 1) / tiles, c0, c1);
  }
}

// Splits [0, n) into `parts` ranges whose inner bounds are multiples of `align`; returns part p's range.
inline void Split(int64_t n, int parts, int p, int64_t align, int64_t* lo, int64_t* hi) {
  auto at = [&](int q) {
    if (q >= parts) return n;
    const int64_t b = (n * q / parts) / align * align;
    return b < n ? b : n;
  };
  *lo = at(p);
  *hi = at(p + 1);
}

// Output columns per thread: below this a second thread costs more to wake than it saves.
constexpr int64_t kMinColumnsPerThread = 256;

// Threads for one call of N output columns: XLA's intra-op pool and the caller, on the cores usable now
// (parallel.h: a process pinned to one core, as SSD's split placement pins each side, runs on one thread).
int ThreadsFor(ffi::ThreadPool& pool, int64_t n) { return ssd_par::Threads(pool, n / kMinColumnsPerThread); }

template <typename T, ffi::DataType D>
ffi::Error RowsMatmulTImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<D> e, ffi::ResultBuffer<ffi::F32> y) {
  auto ed = e.dimensions();
  if (ed.size() != 2) return ffi::Error::InvalidArgument("weights must be 2-D");
  const int64_t N = ed[0], K = ed[1], M = Rows(x);
  if (M < 1) return ffi::Error::Success();
  const float* X = x.typed_data();
  const T* E = reinterpret_cast<const T*>(e.untyped_data());
  float* Y = y->typed_data();
  ssd_par::Run(pool, ThreadsFor(pool, N), [&](int part, int parts) {
    int64_t n0, n1;
    Split(N, parts, part, 8, &n0, &n1);
      const int64_t chunk = std::max<int64_t>(8, kChunkBytes / (sizeof(T) * std::max<int64_t>(K, 1)));
      Tiled(M, n0, n1, chunk, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
        SSD_ROWS_CASES(r1 - r0, DotRows, X + r0 * K, E, Y + r0 * N, K, N, c0, c1)
      });
  });
  return ffi::Error::Success();
}

template <typename T, ffi::DataType D>
ffi::Error RowsMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<D> w, ffi::ResultBuffer<ffi::F32> y) {
  auto wd = w.dimensions();
  if (wd.size() != 2) return ffi::Error::InvalidArgument("weights must be 2-D");
  const int64_t K = wd[0], N = wd[1], M = Rows(x);
  if (M < 1) return ffi::Error::Success();
  const float* X = x.typed_data();
  const T* W = reinterpret_cast<const T*>(w.untyped_data());
  float* Y = y->typed_data();
  if (K == 0) {
    std::memset(Y, 0, sizeof(float) * M * N);
    return ffi::Error::Success();
  }
  ssd_par::Run(pool, ThreadsFor(pool, N), [&](int part, int parts) {
    int64_t n0, n1;
    Split(N, parts, part, kW, &n0, &n1);
      const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (static_cast<int64_t>(sizeof(T)) * K * kW)) * kW;
      Tiled(M, n0, n1, chunk, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
        SSD_ROWS_CASES(r1 - r0, AxpyRows, X + r0 * K, W, Y + r0 * N, K, N, c0, c1)
      });
  });
  return ffi::Error::Success();
}

// ---- y[M, N] = x[M, K] @ w[N, K]^T, weights in GGUF blocks of 32 along K (Q8_0, Q4_1) as the file stores them ----
//
// The dot form above with each weight vector widened in registers instead of loaded: each block's 32 weights become
// kQK / kW vectors holding exactly what gguf's dequantize gives (Q8_0: d * q; Q4_1: fl(d * q) + m, where d * q is
// exact in float32: an 11-bit half times an 8- or 4-bit integer), element k in lane k % kW as the dot form loads it,
// then accumulated by the same Fma()s in k order, the same reduction tree. So a row's result equals the float32 dot
// form on the dequantized weights, bit for bit, and does not depend on the row count. Each weight byte is read once
// for all M rows. One row costs about 7 vector operations a Q4_1 block on AVX-512 (table, extend, shift, two picks,
// two multiply-adds) and each further row two multiply-adds a block: the float32 FMA per weight per row is the floor
// of an exact product.
constexpr int kQK = 32;  // weights per block

// IEEE half to float (exact: every half is a float).
inline float Half(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#endif
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (exp == 0x1f ? 0x7f800000u : (exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// n <= 16 halves to floats (16 at once with F16C).
inline void Halves(const uint16_t* h, int n, float* out) {
#if defined(__F16C__)
  if (n == 16) {
    for (int i = 0; i < 16; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
    return;
  }
#endif
  for (int i = 0; i < n; ++i) out[i] = Half(h[i]);
}

// The blocks of a matrix [N, K]: per row K/32 blocks of kQBytes value bytes, scales d and (Q4_1) mins m [N, K/32].
struct Blocks {
  const uint8_t* q;
  const uint16_t* d;
  const uint16_t* m;
  int64_t K;
};

// a in every lane as it is: one broadcast (Splat's vf{} + a costs a scalar add first, and turns a -0 scale into +0,
// where gguf's d * q keeps the sign of zero).
inline vf Bcast(float a) {
#if SSD_VW == 16
  return reinterpret_cast<vf>(_mm512_set1_ps(a));
#elif defined(__AVX2__)
  return reinterpret_cast<vf>(_mm256_set1_ps(a));
#else
  vf v;
  for (int i = 0; i < kW; ++i) v[i] = a;
  return v;
#endif
}

// A block's kQK weights widened to float32 as kC vectors (vector c: elements [c * kW, (c + 1) * kW)), exactly as
// gguf dequantizes them. A whole block at a time: its bytes are loaded and zero- or sign-extended once, not per vector.
constexpr int kC = kQK / kW;

struct Q80 {  // q: int8 values; w = d * q
  static constexpr int kQBytes = kQK;
  static constexpr bool kMin = false;
  static void Widen(const uint8_t* p, float d, float, vf* e) {
    const vf dv = Bcast(d);
    for (int c = 0; c < kC; ++c) {
#if SSD_VW == 16
      const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c * kW)));
      e[c] = reinterpret_cast<vf>(_mm512_cvtepi32_ps(v)) * dv;
#elif defined(__AVX2__)
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c * kW)));
      e[c] = reinterpret_cast<vf>(_mm256_cvtepi32_ps(v)) * dv;
#else
      vf r;
      for (int i = 0; i < kW; ++i) r[i] = static_cast<float>(reinterpret_cast<const int8_t*>(p)[c * kW + i]);
      e[c] = r * dv;
#endif
    }
  }
};

struct Q41 {  // q: byte j of a block holds element j in its low nibble, element j + 16 in its high nibble
  static constexpr int kQBytes = kQK / 2;
  static constexpr bool kMin = true;
  // w = fl(d * q + m), fused or not the same number: d * q is exact in float32, so the one rounding is the add's.
  static void Widen(const uint8_t* p, float d, float m, vf* e) {
#if SSD_VW == 16
    // The block's 16 possible weights are one register (d * iota + m), and each nibble picks its weight (vpermps, which
    // reads only an index's low 4 bits): the 16 bytes are zero-extended once, the low nibbles index as they are and
    // the high ones after a shift; no int-to-float conversion and no multiply-add per weight.
    const vf table = Fma(vf{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, Bcast(d), Bcast(m));
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    e[0] = reinterpret_cast<vf>(_mm512_permutexvar_ps(idx, reinterpret_cast<__m512>(table)));
    e[1] = reinterpret_cast<vf>(_mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), reinterpret_cast<__m512>(table)));
#elif defined(__AVX2__)
    // Bytes 0-7 and 8-15 zero-extended once each; low nibbles by a mask, high ones by a shift.
    const vf dv = Bcast(d), mv = Bcast(m);
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    const __m256i f = _mm256_set1_epi32(15);
    const __m256i q[kC] = {_mm256_and_si256(lo, f), _mm256_and_si256(hi, f), _mm256_srli_epi32(lo, 4),
                           _mm256_srli_epi32(hi, 4)};
    for (int c = 0; c < kC; ++c) e[c] = Fma(reinterpret_cast<vf>(_mm256_cvtepi32_ps(q[c])), dv, mv);
#else
    const vf dv = Bcast(d), mv = Bcast(m);
    for (int c = 0; c < kC; ++c) {
      vf r;
      for (int i = 0; i < kW; ++i) {
        const int j = c * kW + i;
        r[i] = static_cast<float>(j < kQBytes ? p[j] & 15 : p[j - kQBytes] >> 4);
      }
      e[c] = Fma(r, dv, mv);
    }
#endif
  }
};

constexpr int kScaleGroup = 16;  // blocks whose scales are widened at once

template <int M, int NR, typename B>
inline void BlockDot(const float* X, const Blocks& w, float* Y, int64_t K, int64_t N, int64_t n) {
  const int64_t nb = K / kQK;
  const uint8_t* qr[NR];
  const uint8_t* ahead[NR];
  const uint16_t* dr[NR];
  const uint16_t* mr[NR];
  const bool pref = n + (kDotPrefetchBlocks + 1) * NR <= N;
  for (int r = 0; r < NR; ++r) {
    qr[r] = w.q + (n + r) * nb * B::kQBytes;
    ahead[r] = pref ? w.q + (n + kDotPrefetchBlocks * NR + r) * nb * B::kQBytes : nullptr;
    dr[r] = w.d + (n + r) * nb;
    mr[r] = B::kMin ? w.m + (n + r) * nb : nullptr;
  }
  vf acc[M][NR];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = vf{};
  float sd[NR][kScaleGroup], sm[NR][kScaleGroup];
  for (int64_t g = 0; g < nb; g += kScaleGroup) {
    const int gn = nb - g < kScaleGroup ? static_cast<int>(nb - g) : kScaleGroup;
    for (int r = 0; r < NR; ++r) {
      Halves(dr[r] + g, gn, sd[r]);
      if (B::kMin) Halves(mr[r] + g, gn, sm[r]);
    }
    for (int j = 0; j < gn; ++j) {
      const int64_t b = g + j;
      if (pref && (b * B::kQBytes) % 64 == 0)
        for (int r = 0; r < NR; ++r) __builtin_prefetch(ahead[r] + b * B::kQBytes, 0, 2);
      // The NR rows' blocks widened (kC vectors each), then each input vector loaded once for all NR rows.
      vf e[NR][kC];
      for (int r = 0; r < NR; ++r) B::Widen(qr[r] + b * B::kQBytes, sd[r][j], B::kMin ? sm[r][j] : 0.f, e[r]);
      for (int c = 0; c < kC; ++c)
        for (int m = 0; m < M; ++m) {
          const vf x = Load(X + m * K + b * kQK + c * kW);
          for (int r = 0; r < NR; ++r) acc[m][r] = Fma(x, e[r][c], acc[m][r]);
        }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < NR; ++r) {
      const float s = HSum(acc[m][r]), t = 0.f;  // t: the dot form's empty k tail, added the same way
      Y[m * N + n + r] = s + t;
    }
}

template <int M, typename B>
void BlockDotRows(B /* kind */, const float* X, const Blocks& w, float* Y, int64_t K, int64_t N, int64_t n0,
                  int64_t n1) {
  constexpr int NR = DotRowsPerBlock<M>();
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) BlockDot<M, NR, B>(X, w, Y, K, N, n);
  for (; n < n1; ++n) BlockDot<M, 1, B>(X, w, Y, K, N, n);
}

template <typename B>
ffi::Error BlocksT(ffi::ThreadPool& pool, ffi::Buffer<ffi::F32>& x, const Blocks& w, int64_t N, ffi::ResultBuffer<ffi::F32>& y,
                   int64_t row_bytes) {
  const int64_t K = w.K, M = Rows(x);
  if (K % kQK != 0 || x.dimensions().back() != K)
    return ffi::Error::InvalidArgument("blocks: x must have K columns, K a multiple of 32");
  if (M < 1) return ffi::Error::Success();
  const float* X = x.typed_data();
  float* Y = y->typed_data();
  ssd_par::Run(pool, ThreadsFor(pool, N), [&](int part, int parts) {
    int64_t n0, n1;
    Split(N, parts, part, 8, &n0, &n1);
      const int64_t chunk = std::max<int64_t>(8, kChunkBytes / std::max<int64_t>(row_bytes, 1));
      Tiled(M, n0, n1, chunk, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
        SSD_ROWS_CASES(r1 - r0, BlockDotRows, B{}, X + r0 * K, w, Y + r0 * N, K, N, c0, c1)
      });
  });
  return ffi::Error::Success();
}

const uint16_t* HalfData(ffi::Buffer<ffi::F16>& h) { return reinterpret_cast<const uint16_t*>(h.untyped_data()); }

ffi::Error RowsQ80TImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q, ffi::Buffer<ffi::F16> d,
                        ffi::ResultBuffer<ffi::F32> y) {
  auto qd = q.dimensions();
  if (qd.size() != 2) return ffi::Error::InvalidArgument("blocks must be 2-D");
  const Blocks w{reinterpret_cast<const uint8_t*>(q.untyped_data()), HalfData(d), nullptr, qd[1]};
  return BlocksT<Q80>(pool, x, w, qd[0], y, qd[1] + qd[1] / kQK * 2);
}

ffi::Error RowsQ41TImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> q, ffi::Buffer<ffi::F16> d,
                        ffi::Buffer<ffi::F16> m, ffi::ResultBuffer<ffi::F32> y) {
  auto qd = q.dimensions();
  if (qd.size() != 2) return ffi::Error::InvalidArgument("blocks must be 2-D");
  const Blocks w{reinterpret_cast<const uint8_t*>(q.untyped_data()), HalfData(d), HalfData(m), 2 * qd[1]};
  return BlocksT<Q41>(pool, x, w, qd[0], y, qd[1] + qd[1] / (kQK / 2) * 4);
}

// Each row's sum of squares (RMSNorm's), in one fixed order whatever the row count: eight running sums over k
// (lane k % 8, unfused multiply then add), the tail added to lanes in order, then a fixed tree over the lanes.
// XLA's reduce promises no order (on XLA:CPU, 8 or more rows of 576 go to a YNNPACK fusion that sums differently).
ffi::Error RowsSumSqImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  auto dims = x.dimensions();
  const int64_t M = Rows(x), K = dims.size() == 0 ? 1 : dims[dims.size() - 1];
  const float* X = x.typed_data();
  float* Y = y->typed_data();
  for (int64_t r = 0; r < M; ++r) {
    const float* p = X + r * K;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
      for (int l = 0; l < 8; ++l) a[l] = a[l] + p[k + l] * p[k + l];
    for (int l = 0; k + l < K; ++l) a[l] = a[l] + p[k + l] * p[k + l];
    Y[r] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsMatmul, (RowsMatmulImpl<float, ffi::F32>),
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsMatmulT, (RowsMatmulTImpl<float, ffi::F32>),
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsQ80T, RowsQ80TImpl,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F16>>().Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsQ41T, RowsQ41TImpl,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F16>>().Arg<ffi::Buffer<ffi::F16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsMatmulBf16, (RowsMatmulImpl<Bf16, ffi::BF16>),
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsMatmulBf16T, (RowsMatmulTImpl<Bf16, ffi::BF16>),
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdRowsSumSq, RowsSumSqImpl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
