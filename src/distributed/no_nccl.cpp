// CPU builds: no NCCL. Asking for it is a NotSupportedError naming the build option.
#include "distributed/checks.h"
#include "microllm/distributed/communicator.h"

namespace microllm::distributed {

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchInfo&, Device, double) {
  throw NotSupportedError("distributed", "this build has no NCCL (configure with -DMICROLLM_CUDA=ON)");
}

namespace detail {
void abort_nccl_communicators() noexcept {}
}  // namespace detail

}  // namespace microllm::distributed
