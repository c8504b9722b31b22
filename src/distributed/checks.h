// Shared by the communicators (internal header): argument checks, and the pieces of abort_job that each
// backend provides.
#pragma once

#include "microllm/core/tensor.h"

namespace microllm::distributed::detail {

// Defined, contiguous, on `device`; with `reduction`, f32, bf16 or f64. Errors name `op`.
void check_tensor(const Tensor& t, Device device, const char* op, bool reduction);
// whole.numel() == world_size * block.numel() and the dtypes agree.
void check_blocks(const Tensor& whole, const Tensor& block, int world_size, const char* op);

// This rank and the world size as MPI sees them; false when MPI is not running (mpi_communicator.cpp).
bool mpi_rank(int& rank, int& world) noexcept;
// MPI_Abort when MPI is running; returns otherwise.
void abort_mpi(int exit_code) noexcept;
// ncclCommAbort on every live NCCL communicator (nccl_communicator.cpp; nothing in CPU builds).
void abort_nccl_communicators() noexcept;

}  // namespace microllm::distributed::detail
