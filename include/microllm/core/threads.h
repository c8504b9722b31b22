// Host thread count used by CPU kernels (OpenMP underneath).
#pragma once

namespace microllm {

// Threads CPU kernels may use; defaults to OMP_NUM_THREADS or the number of cores.
int num_threads();
void set_num_threads(int threads);

namespace detail {
int omp_thread_index();  // 0-based index of the calling thread inside a parallel region
}  // namespace detail

}  // namespace microllm
