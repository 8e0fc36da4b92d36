// Masked attention over a KV cache for XLA:CPU, reading only the slots each query sees.
//
// The jnp reference scores every query against every cache slot, builds a dense [T, S] mask and runs a softmax
// over all of it: at decode (one query, a few hundred visible slots of a cache of S) that is most of the work, and
// on the 2-core CPU it measured about a quarter of the target's whole AR step. This kernel walks, per query, the
// slots < visible_end and then its own tree branch's slots (ssd_jax/kernels/mask.py describes the metadata),
// with an online softmax, so the cost follows the visible length, not the cache's size. The query heads that share
// a KV head are handled together, so each key and value row is read once per group, and so are the queries of one
// call (a verify's T) at each whole block of keys. Keys go in blocks of 16: the block's scores as vectors, one
// maximum and one rescale of the running sums per block, the weights by simd.h's vector exp (not a libm expf per key
// and head, which was a third of the kernel's time).
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

#include <atomic>

#include "parallel.h"
#include "simd.h"

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace ssd_simd;  // NOLINT: vf, kW, Load, Store, Splat, Fma, HSum16, Exp

constexpr float kNeg = -1e30f;
constexpr int kMaxR = 16;  // query heads per KV head handled in registers-sized scratch
constexpr int kKB = 16;   // keys per block: one maximum, one rescale and vector exps per block (HSum16 takes 16)

// x[j] = q . key slots[j] for j < n <= kKB, each in one fixed order: lanes of vectors in d order, HSum's reduction
// tree (for the 16 keys together: HSum16), then the tail past the last whole vector in order.
void Scores(const float* q, const float* k, int64_t stride, const int64_t* slots, int n, int64_t D, float* x) {
  const float* ks[kKB];
  for (int j = 0; j < kKB; ++j) ks[j] = k + slots[j < n ? j : 0] * stride;  // padding lanes: any key, result unused
  vf acc[kKB];
  for (int j = 0; j < kKB; ++j) acc[j] = vf{};
  const int64_t dv = D / kW * kW;
  for (int64_t i = 0; i < dv; i += kW) {  // d outer, keys inner: each q vector loaded once for the 16 keys
    const vf qi = Load(q + i);
    for (int j = 0; j < kKB; ++j) acc[j] = Fma(qi, Load(ks[j] + i), acc[j]);
  }
  HSum16(acc, x);
  for (int j = 0; j < n; ++j)
    for (int64_t i = dv; i < D; ++i) x[j] = Fma(q[i], ks[j][i], x[j]);
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
    Scores(st.q + r * D, st.k, stride, slots, n, D, x);
    for (int j = n; j < kKB; ++j) x[j] = kNeg;
    vf xs[kKB / kW];
    float m = st.m[r];
    for (int u = 0; u < kKB / kW; ++u) {
      xs[u] = Load(x + u * kW) * Splat(st.scale);
      for (int j = 0; j < kW; ++j)
        if (u * kW + j < n) m = std::max(m, xs[u][j]);
    }
    vf sum = vf{};  // padding lanes: exp(-1e30 * scale - m) = 0 exactly
    for (int u = 0; u < kKB / kW; ++u) {
      const vf pu = Exp(xs[u] - Splat(m));
      Store(p[r] + u * kW, pu);
      sum = sum + pu;
    }
    c[r] = Exp(st.m[r] - m);
    st.l[r] = Fma(st.l[r], c[r], HSum(sum));
    st.m[r] = m;
  }
  // Each output element: times c, then one multiply-add per key in slot order; four vectors of it at a time (four
  // independent chains), then single vectors, then single floats.
  int64_t i = 0;
  for (; i + 4 * kW <= D; i += 4 * kW) {
    for (int64_t r = 0; r < R; ++r) {
      float* o = st.acc + r * D + i;
      const vf cr = Splat(c[r]);
      vf a0 = Load(o) * cr, a1 = Load(o + kW) * cr, a2 = Load(o + 2 * kW) * cr, a3 = Load(o + 3 * kW) * cr;
      for (int j = 0; j < n; ++j) {
        const float* vs = st.v + slots[j] * stride + i;
        const vf pj = Splat(p[r][j]);
        a0 = Fma(pj, Load(vs), a0);
        a1 = Fma(pj, Load(vs + kW), a1);
        a2 = Fma(pj, Load(vs + 2 * kW), a2);
        a3 = Fma(pj, Load(vs + 3 * kW), a3);
      }
      Store(o, a0);
      Store(o + kW, a1);
      Store(o + 2 * kW, a2);
      Store(o + 3 * kW, a3);
    }
  }
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

// The call's arrays and sizes (layouts above).
struct Call {
  const float *Q, *K, *V;
  const int32_t *VE, *TS, *TB, *TD;
  float* O;
  int64_t T, H, S, G, D, R, tree_width;
  float scale;
};

// Queries [t0, t1) of batch row b, KV head g. Each query folds its slots in blocks of kKB: the whole blocks of its
// prefix below visible_end (slots 0-15, 16-31, ...), then one more block at a time of the prefix's rest and its tree
// branch (slots the prefix already counted are skipped). That sequence follows from the query's own metadata alone;
// the queries of the call only take their turns at each whole block together, so its keys and values come from
// memory once for all of them.
void AttendRows(const Call& c, int64_t b, int64_t g, int64_t t0, int64_t t1) {
  const int64_t n_rows = t1 - t0, RD = c.R * c.D;
  std::vector<float> acc(static_cast<size_t>(n_rows * RD), 0.f);
  std::vector<GroupState> st(static_cast<size_t>(n_rows));
  std::vector<int64_t> ends(static_cast<size_t>(n_rows));
  int64_t max_end = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t bt = b * c.T + t0 + i;
    st[i] = GroupState{c.Q + (bt * c.H + g * c.R) * c.D, c.K + (b * c.S * c.G + g) * c.D,
                       c.V + (b * c.S * c.G + g) * c.D, c.G, c.D, c.R, c.scale, {}, {}, acc.data() + i * RD};
    for (int64_t r = 0; r < c.R; ++r) {
      st[i].m[r] = kNeg;
      st[i].l[r] = 0.f;
    }
    ends[i] = std::min<int64_t>(std::max<int64_t>(c.VE[bt], 0), c.S);
    max_end = std::max(max_end, ends[i]);
  }
  int64_t slots[kKB];
  for (int64_t s0 = 0; s0 + kKB <= max_end; s0 += kKB) {
    for (int j = 0; j < kKB; ++j) slots[j] = s0 + j;
    for (int64_t i = 0; i < n_rows; ++i)
      if (s0 + kKB <= ends[i]) FoldBlock(st[i], slots, kKB);
  }
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t bt = b * c.T + t0 + i, end = ends[i];
    int n = 0;
    auto add = [&](int64_t s) {
      slots[n++] = s;
      if (n == kKB) {
        FoldBlock(st[i], slots, n);
        n = 0;
      }
    };
    for (int64_t s = end / kKB * kKB; s < end; ++s) add(s);
    const int64_t lo = static_cast<int64_t>(c.TS[b]) + c.TB[bt];
    if (c.tree_width > 0 && c.TD[bt] >= 0) {
      for (int64_t d = 0; d <= c.TD[bt]; ++d) {
        const int64_t s = lo + d * c.tree_width;
        if (s >= c.S) break;
        if (s >= end && s >= 0) add(s);  // slots below visible_end are already counted
      }
    }
    if (n > 0) FoldBlock(st[i], slots, n);
    for (int64_t r = 0; r < c.R; ++r) {
      float* o = c.O + (bt * c.H + g * c.R + r) * c.D;
      const float* a = st[i].acc + r * c.D;
      const float inv = st[i].l[r] > 0.f ? 1.f / st[i].l[r] : 0.f;  // no visible key (padding): zeros, as the reference
      for (int64_t d = 0; d < c.D; ++d) o[d] = a[d] * inv;
    }
  }
}

ffi::Error MaskedAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
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
  const Call c{q.typed_data(), k.typed_data(), v.typed_data(), visible_end.typed_data(), tree_start.typed_data(),
               tree_branch.typed_data(), tree_depth.typed_data(), out->typed_data(), T, H, S, G, D, R, tree_width,
               1.f / std::sqrt(static_cast<float>(D))};
  // Tasks: (b, g, a chunk of the queries). Fewer chunks share more key loads; enough of them keep every thread busy
  // (two tasks a thread). The chunking changes no result: each query's blocks are its own.
  const int threads = ssd_par::Threads(pool, B * G * T);
  const int64_t chunks = std::min<int64_t>(T, std::max<int64_t>(1, (2 * threads + B * G - 1) / (B * G)));
  const int64_t per = (T + chunks - 1) / chunks, tasks = B * G * chunks;
  std::atomic<int64_t> next{0};  // tasks go to whichever thread is free first
  ssd_par::Run(pool, tasks > 1 ? threads : 1, [&](int, int) {
    for (int64_t i = next.fetch_add(1); i < tasks; i = next.fetch_add(1)) {
      const int64_t ch = i % chunks, g = (i / chunks) % G, b = i / (chunks * G);
      const int64_t t0 = ch * per, t1 = std::min(T, t0 + per);
      if (t0 < t1) AttendRows(c, b, g, t0, t1);
    }
  });
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
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("tree_width"));
