#include "microllm/core/threads.h"

#include <omp.h>

#include <atomic>

namespace microllm {
namespace {
std::atomic<int> g_threads{0};  // 0: not chosen yet
}  // namespace

int num_threads() {
  const int chosen = g_threads.load(std::memory_order_relaxed);
  return chosen > 0 ? chosen : omp_get_max_threads();
}

void set_num_threads(int threads) { g_threads.store(threads > 0 ? threads : 0, std::memory_order_relaxed); }

namespace detail {
int omp_thread_index() { return omp_get_thread_num(); }
}  // namespace detail

}  // namespace microllm
