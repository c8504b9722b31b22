// The paged KV cache's CUDA kernels (paged_attention.cu): what tests ask of them (internal header).
#pragma once

#include <cstdint>

namespace microllm::cuda_kernels::paged {

// How many paged_decode_attention_projected calls ran as one kernel (attention and o projection fused) since
// the process started; the others ran the composition of the two ops.
int64_t projected_launches();

}  // namespace microllm::cuda_kernels::paged
