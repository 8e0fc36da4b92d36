// Masked attention over a KV cache for XLA:CPU, reading only the slots each query sees.
//
// The jnp reference scores every query against every cache slot, builds a dense [T, S] mask and runs a softmax
// over all of it: at decode (one query, a few hundred visible slots of a cache of S) that is most of the work, and
// on the 2-core CPU it measured about a quarter of the target's whole AR step. This kernel walks, per query, the
// slots < visible_end and then its own tree branch's slots (ssd_jax/kernels/mask.py describes the metadata),
// with an online softmax, so the cost follows the visible length, not the cache's size. The query heads that share
// a KV head are handled together, so each key and value row is read once per group.
//
// Layouts (row-major): q [B, T, H, D], k and v [B, S, G, D], visible_end / tree_branch / tree_depth [B, T],
// tree_start [B]; out [B, T, H, D]. H = G * R. Computed in float32.
//
// A query's output depends only on its own q, mask metadata and the keys it sees, never on the other queries in the
// call: an AR step and the same position inside a verify get the same bits. Sums run in a fixed order with explicit
// FMAs (simd.h), so neither the vector code the compiler picks nor a buffer's alignment can change them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "simd.h"

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace ssd_simd;  // NOLINT: vf, kW, Load, Fma, HSum

constexpr float kNeg = -1e30f;
constexpr int kMaxR = 16;  // query heads per KV head handled in registers-sized scratch
constexpr int kKB = 16;   // keys per block: one maximum, one rescale and vector exps per block (a multiple of kW)

int Threads() {
  const int n = omp_get_num_procs();
  return n < 1 ? 1 : n;
}

// Lanes of vectors in k order, the fixed reduction tree, then the tail in order.
inline float Dot(const float* a, const float* b, int64_t d) {
  vf acc = vf{};
  int64_t i = 0;
  for (; i + kW <= d; i += kW) acc = Fma(Load(a + i), Load(b + i), acc);
  float s = HSum(acc);
  for (; i < d; ++i) s = Fma(a[i], b[i], s);
  return s;
}

// The online-softmax state of the R query heads of one KV head for one query.
struct GroupState {
  const float* q;  // [R, D]
  const float* k;  // key row s at k + s * G * D
  const float* v;
  int64_t G, D, R;
  float scale;
  float m[kMaxR], l[kMaxR];
  float* acc;  // [R, D]
};

// Folds up to kKB keys (cache slots `slots[0..n)`) into the state: per head the block's scores, one new maximum and
// one rescale of the running sums, the weights by the vector exp (padding lanes get exp(-1e30) = 0), then the values
// in slot order. Every step is the same for every query: a query's result depends only on its own slots.
void FoldBlock(GroupState& st, const int64_t* slots, int n) {
  const int64_t D = st.D, R = st.R, stride = st.G * D;
  alignas(64) float x[kKB], p[kMaxR][kKB];
  float c[kMaxR];
  for (int64_t r = 0; r < R; ++r) {
    float mb = kNeg;
    for (int j = 0; j < n; ++j) {
      x[j] = Dot(st.q + r * D, st.k + slots[j] * stride, D) * st.scale;
      mb = std::max(mb, x[j]);
    }
    for (int j = n; j < kKB; ++j) x[j] = kNeg;
    const float m = std::max(st.m[r], mb);
    for (int j = 0; j < kKB; j += kW) Store(p[r] + j, Exp(Load(x + j) - Splat(m)));
    c[r] = Exp(st.m[r] - m);
    float sum = 0.f;
    for (int j = 0; j < n; ++j) sum += p[r][j];
    st.l[r] = Fma(st.l[r], c[r], sum);
    st.m[r] = m;
  }
  int64_t i = 0;
  for (; i + kW <= D; i += kW) {
    for (int64_t r = 0; r < R; ++r) {
      vf a = Load(st.acc + r * D + i) * Splat(c[r]);
      for (int j = 0; j < n; ++j) a = Fma(Splat(p[r][j]), Load(st.v + slots[j] * stride + i), a);
      Store(st.acc + r * D + i, a);
    }
  }
  for (; i < D; ++i) {
    for (int64_t r = 0; r < R; ++r) {
      float a = st.acc[r * D + i] * c[r];
      for (int j = 0; j < n; ++j) a = Fma(p[r][j], st.v[slots[j] * stride + i], a);
      st.acc[r * D + i] = a;
    }
  }
}

// One (row b, query t, KV head g): the R query heads of the group against the visible slots, in blocks of kKB: the
// prefix below visible_end, then the query's tree branch (slots the prefix already counted are skipped).
void AttendGroup(const float* q, const float* k, const float* v, float* out, int64_t S, int64_t G, int64_t D,
                 int64_t R, int64_t vis_end, int64_t tree_lo, int64_t tree_depth, int64_t tree_width,
                 float scale) {
  std::vector<float> acc(static_cast<size_t>(R * D), 0.f);
  GroupState st{q, k, v, G, D, R, scale, {}, {}, acc.data()};
  for (int64_t r = 0; r < R; ++r) {
    st.m[r] = kNeg;
    st.l[r] = 0.f;
  }
  int64_t slots[kKB];
  int n = 0;
  auto add = [&](int64_t s) {
    slots[n++] = s;
    if (n == kKB) {
      FoldBlock(st, slots, n);
      n = 0;
    }
  };
  const int64_t end = std::min<int64_t>(std::max<int64_t>(vis_end, 0), S);
  for (int64_t s = 0; s < end; ++s) add(s);
  if (tree_width > 0 && tree_depth >= 0) {
    for (int64_t d = 0; d <= tree_depth; ++d) {
      const int64_t s = tree_lo + d * tree_width;
      if (s >= S) break;
      if (s >= end && s >= 0) add(s);  // slots below visible_end are already counted
    }
  }
  if (n > 0) FoldBlock(st, slots, n);
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * D;
    const float inv = st.l[r] > 0.f ? 1.f / st.l[r] : 0.f;  // no visible key (padding): zeros, as the reference gives
    for (int64_t i = 0; i < D; ++i) o[i] = acc[r * D + i] * inv;
  }
}

ffi::Error MaskedAttentionImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                               ffi::Buffer<ffi::S32> visible_end, ffi::Buffer<ffi::S32> tree_start,
                               ffi::Buffer<ffi::S32> tree_branch, ffi::Buffer<ffi::S32> tree_depth,
                               ffi::ResultBuffer<ffi::F32> out, int64_t tree_width) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 4) return ffi::Error::InvalidArgument("q and k must be 4-D");
  const int64_t B = qd[0], T = qd[1], H = qd[2], D = qd[3], S = kd[1], G = kd[2];
  if (kd[0] != B || kd[3] != D || G <= 0 || H % G != 0) return ffi::Error::InvalidArgument("q/k shapes disagree");
  const int64_t R = H / G;
  if (R > kMaxR) return ffi::Error::InvalidArgument("too many query heads per KV head");
  const float* Q = q.typed_data();
  const float* K = k.typed_data();
  const float* V = v.typed_data();
  const int32_t* VE = visible_end.typed_data();
  const int32_t* TS = tree_start.typed_data();
  const int32_t* TB = tree_branch.typed_data();
  const int32_t* TD = tree_depth.typed_data();
  float* O = out->typed_data();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const int64_t tasks = B * T * G;
#pragma omp parallel for schedule(dynamic, 1) num_threads(Threads()) if (tasks > 1)
  for (int64_t i = 0; i < tasks; ++i) {
    const int64_t g = i % G, bt = i / G, b = bt / T;
    const int64_t lo = static_cast<int64_t>(TS[b]) + TB[bt];
    AttendGroup(Q + (bt * H + g * R) * D, K + (b * S * G + g) * D, V + (b * S * G + g) * D,
                O + (bt * H + g * R) * D, S, G, D, R, VE[bt], lo, TD[bt], tree_width, scale);
  }
  return ffi::Error::Success();
}

// For tests: out[0] = exp(x) by the vector form (simd.h), out[1] by the scalar form, for x of any length.
ffi::Error VectorExpImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> out) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  const float* X = x.typed_data();
  float* O = out->typed_data();
  for (int64_t i = 0; i < n; i += kW) {
    alignas(64) float buf[kW] = {};
    const int64_t w = std::min<int64_t>(kW, n - i);
    std::memcpy(buf, X + i, sizeof(float) * w);
    Store(buf, Exp(Load(buf)));
    std::memcpy(O + i, buf, sizeof(float) * w);
  }
  for (int64_t i = 0; i < n; ++i) O[n + i] = Exp(X[i]);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdVectorExp, VectorExpImpl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SsdMaskedAttention, MaskedAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("tree_width"));
