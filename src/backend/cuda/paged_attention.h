// The paged KV cache's CUDA kernels (paged_attention.cu): what tests ask of them (internal header).
#pragma once

#include <cstdint>

namespace microllm::cuda_kernels::paged {

// How many paged_decode_attention_projected calls ran as one kernel (attention and o projection fused) since
// the process started; the others ran the composition of the two ops.
int64_t projected_launches();
// How many of those ran as paged_token_cluster_kernel (a context past one split, a token's attention in one cluster).
int64_t token_cluster_launches();

// Whether paged_decode_attention_projected may take paged_token_cluster_kernel (on unless
// MICROLLM_DISABLE=attention-cluster); set_token_clusters overrides it process-wide (tests run both paths).
bool token_clusters();
void set_token_clusters(bool enabled);
// How many ran as head clusters (paged_token_cluster_kernel's kHeadClusters: a kv head's slices a cluster, e.g. a
// 4,096-key graph), and the switch for them (on unless MICROLLM_DISABLE=attention-head-cluster), as above.
int64_t head_cluster_launches();
bool head_clusters();
void set_head_clusters(bool enabled);

}  // namespace microllm::cuda_kernels::paged
