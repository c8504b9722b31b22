// Host threading (internal header): OpenMP underneath, one helper on top.
#pragma once

#include <algorithm>
#include <cstdint>

#include "microllm/core/threads.h"

namespace microllm::detail {

// Work below this many elements runs on the calling thread: thread start-up would cost more.
constexpr int64_t kParallelGrain = 32768;

// Calls fn(begin, end) on disjoint chunks of [begin, end) of at least `grain` items, in parallel.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
  const int64_t count = end - begin;
  if (count <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, count / std::max<int64_t>(grain, 1));
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), max_chunks));
  if (threads <= 1) {
    fn(begin, end);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_thread_index();
    const int64_t chunk = (count + threads - 1) / threads;
    const int64_t lo = begin + t * chunk;
    const int64_t hi = std::min(end, lo + chunk);
    if (lo < hi) fn(lo, hi);
  }
}

}  // namespace microllm::detail
