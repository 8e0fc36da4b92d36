// The kernels' one way to use several cores: XLA's own intra-op thread pool, which the XLA FFI hands a CPU custom
// call (ffi::ThreadPool). No second pool (OpenMP's team) shares the cores with XLA's: a token's ~200 kernel calls
// then wake no threads of their own, and nothing of ours spins or sleeps between calls.
//
// Run(pool, n, fn) calls fn(t, n) for every t in 0..n-1, at most n at once: the calling thread takes parts itself
// and the pool's threads take the others as they start. The caller waits only for parts a pool thread has already
// taken (a part not yet taken is run by whoever comes first), so a busy or absent pool never blocks it: a pool that
// cannot run a task runs it in the caller (ffi::ThreadPool::Schedule), and the parts are then all the caller's.
// Each part writes its own outputs; which thread runs it changes no result.
#ifndef SSD_JAX_KERNELS_PARALLEL_H_
#define SSD_JAX_KERNELS_PARALLEL_H_

#include <sched.h>

#include <atomic>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ssd_par {

// Cores the calling thread may run on now (its affinity: `taskset`, SSD's split placement pins each side). A kernel
// called in a process pinned to one core runs on one thread instead of making threads take turns on that core.
inline int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n < 1 ? 1 : n;
}

// Threads one call may use: the usable cores, at most the pool's threads plus the caller, at most `want`.
inline int Threads(xla::ffi::ThreadPool& pool, int64_t want) {
  int64_t n = UsableCores();
  const int64_t in_pool = pool.num_threads();
  if (in_pool + 1 < n) n = in_pool + 1;
  if (want < n) n = want;
  return n < 1 ? 1 : static_cast<int>(n);
}

template <typename F>
void Run(xla::ffi::ThreadPool& pool, int n, F&& fn) {
  if (n <= 1) {
    fn(0, 1);
    return;
  }
  struct State {
    std::atomic<int> next{0};  // the next part to take
    std::atomic<int> busy{0};  // pool threads between their first look at `next` and their last
  };
  auto st = std::make_shared<State>();
  auto* f = &fn;
  // A pool thread that starts after every part was taken returns without touching fn (the caller may be gone).
  auto worker = [st, f, n]() {
    st->busy.fetch_add(1);
    for (int t = st->next.fetch_add(1); t < n; t = st->next.fetch_add(1)) (*f)(t, n);
    st->busy.fetch_sub(1);
  };
  for (int i = 1; i < n; ++i) pool.Schedule(decltype(worker)(worker));  // a copy each (Schedule takes it over)
  for (int t = st->next.fetch_add(1); t < n; t = st->next.fetch_add(1)) fn(t, n);
  while (st->busy.load() != 0) std::this_thread::yield();  // parts already running elsewhere: short
}

}  // namespace ssd_par

#endif  // SSD_JAX_KERNELS_PARALLEL_H_
