// Which paged attention kernel serves a decode step, and its launch shape: a pure function of the shapes, the
// device's limits and the A/B switches, so that the CPU suite tests it (tests/ops/paged_decode_plan_test.cpp) and
// `microllm bench --explain` prints it. src/backend/cuda/paged_attention.cu launches what it returns; the kernels
// and their design are in src/backend/cuda/paged_kernels.cuh, the measurements behind the constants in
// docs/perf/kernels.md#paged-attention. Device-neutral: no CUDA header here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace microllm::paged_plan {

constexpr int kStagedThreads = 256;  // the staged and cluster kernels
constexpr int kStagedWarps = kStagedThreads / 32;
constexpr int kSmallThreads = 128;  // the combine and simple kernels
constexpr int kMaxFastDim = 256;    // the staged kernels' largest head dim
constexpr int kSimpleKeys = 128;    // keys per step of the simple kernel: one per thread
constexpr int kRowsPerCta = 8;      // query heads per CTA (of one kv head); 1 when the grid would be small
constexpr int kMaxChunk = 256;
constexpr int kMinSplitChunk = 64;
// Past one chunk the splits aim at this many CTAs per SM: a split of 128 keys stages its rows in one round trip as
// a split of 64 does, and the combine merges half as many.
constexpr int kSplitCtasPerSm = 1;
constexpr int64_t kStageBudget = 96 * 1024;        // bytes of staged K and V rows per CTA (2 CTAs fit an SM)
constexpr int64_t kStageBudgetAlone = 144 * 1024;  // one query head per CTA (a small grid): one CTA per SM is
                                                   // fine, and 256 keys of D 128 fit one split (no combine)
constexpr int kMaxStagedSmem = 160 * 1024;  // the staged kernel's shared memory at most: the budget + its f32 rows
constexpr int kMaxSplits = 8192;            // the combine kernel keeps one weight per split in shared memory
// The o projection rides in the attention's kernel for at most this many tokens, and a CTA takes at most this many
// bytes of o_weight: staged in shared memory (replicated clusters) or streamed through L2 (one cluster a token).
// Past 2 tokens the clusters each read all of o_weight through a few SMs, and past these budgets (R1-Distill-1.5B's
// rows) the o GEMV on its own is faster.
constexpr int64_t kMaxProjectedTokens = 2;
constexpr int64_t kMaxStagedProjection = 64 << 10;
constexpr int64_t kMaxStreamedProjection = 128 << 10;
constexpr int kMaxReplicas = 8;      // replicated clusters a token at most
constexpr int kMaxClusterCtas = 16;  // sm_90's largest (non-portable) thread-block cluster
// A token's cluster takes slices of at most this many keys: 512 where its phases run on the tensor cores (a
// 4,096-key graph for 2 kv heads), kMaxChunk on the CUDA cores (slices of 512 keys staged there lost to the splits).
constexpr int64_t kMaxTokenClusterChunk = 512;
// The head clusters' arrival counters a (device, stream): one a (token, replica, rank).
constexpr int64_t kMaxArrivalCounters = kMaxProjectedTokens * kMaxClusterCtas * kMaxReplicas;

// What the decode step asks: q [tokens, q_heads, dim] against max_context keys a token, and for
// paged_decode_attention_projected the o projection's weight [hidden, o_in] (hidden 0: attention alone).
struct DecodeShape {
  int64_t tokens = 0;
  int64_t max_context = 0;
  int q_heads = 0, kv_heads = 0, dim = 0;
  int element_bytes = 0;       // of q and the pools: 2 (bf16, f16) or 4 (f32)
  bool aligned_pools = true;   // both pools' rows 16-byte aligned with unit stride along D
  bool tensor_cores = false;   // CTAs of kRowsPerCta rows compute on the tensor cores for this dtype and D
  int64_t window = 0;          // a sliding window: a token attends to its `window` latest keys (0: all)
  int hidden = 0, o_in = 0;    // o_weight [hidden, o_in]
  bool aligned_weight = true;  // o_weight's rows 16-byte aligned, whole 16-byte packs
  // The most keys a token attends to: the window bounds them (the kernels start at the window's first key).
  int64_t keys() const { return window > 0 && window < max_context ? window : max_context; }
};

struct DeviceLimits {
  int sms = 0;
  int compute_capability = 0;  // 90: sm_90 (thread-block clusters)
  int64_t max_smem_optin = 0;  // bytes of dynamic shared memory a CTA can opt in to
};

// The A/B switches (MICROLLM_DISABLE=attention-o, attention-cluster, attention-head-cluster) and the sweeps'
// replica override (MICROLLM_ATTENTION_O_REPLICAS; 0: the plan chooses).
struct DecodePolicy {
  bool fuse_projection = true;
  bool token_clusters = true;
  bool head_clusters = true;
  int forced_replicas = 0;
};

enum class DecodeKernel {
  simple,           // paged_simple_kernel: layouts the staged kernel cannot take (paged_attention only)
  staged,           // paged_staged_kernel, then paged_combine_kernel past one split
  projected,        // paged_staged_kernel with the o projection: one split, a cluster of q_heads CTAs a token
  token_cluster,    // paged_token_cluster_kernel: a token's kv heads x slices in one cluster
  head_clusters,    // paged_token_cluster_kernel, a cluster of slices per kv head, their parts summed by the last
  split_projected,  // paged_staged_kernel's splits, then paged_combine_projected_kernel in clusters
  composition,      // the fusion's composition: the separate ops (Fusions' default)
};
const char* kernel_name(DecodeKernel kernel);

struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::composition;
  // The staged kernels' key loop: rows_per_cta query heads a CTA (row_blocks of them a kv head), `chunk` keys
  // staged at a time at `pitch` elements a row in a `stage_bytes` region, n_split splits (a combine past one).
  int rows_per_cta = 0, row_blocks = 0, chunk = 0, pitch = 0, n_split = 1, stage_bytes = 0;
  // The o projection: `replicas` clusters a token, each CTA o_cols output columns, its region at proj_offset;
  // rows_staged: its rows of o_weight copied into shared memory (else streamed through L2).
  int slices = 0, replicas = 1, o_cols = 0, proj_offset = 0;
  bool rows_staged = false;
  // The launch: `cluster` CTAs a cluster (0: none) of the clustered kernel (split_projected: the combine), the main
  // kernel's grid, threads and dynamic shared memory, and the second kernel's (combine) where there is one.
  unsigned cluster = 0;
  int64_t grid_x = 0, grid_y = 1;
  int threads = 0;
  size_t smem = 0;
  int64_t combine_grid_x = 0, combine_grid_y = 0;
  size_t combine_smem = 0;

  // One line for `bench --explain` and test messages, e.g. "token_cluster: cluster 16, grid 16x4, ...".
  std::string describe() const;
};

// Whether clusters of a candidate plan's clustered kernel fit the device at once (on CUDA,
// cudaOccupancyMaxActiveClusters > 0 for that kernel, plan.cluster CTAs and its shared memory).
using ClustersFit = std::function<bool(const DecodePlan&)>;

// paged_attention / paged_decode_attention: the staged kernel (simple or composition where the layouts or the grid
// rule it out: `fallback`). A sliding window bounds the keys the plans size their chunks for (DecodeShape::keys).
DecodePlan plan_attention(const DecodeShape& shape, const DeviceLimits& device,
                          DecodeKernel fallback = DecodeKernel::simple);
// paged_decode_attention_projected: the first of projected, token_cluster, head_clusters, split_projected that takes
// the shapes and fits the device; else composition.
DecodePlan plan_attention_projected(const DecodeShape& shape, const DeviceLimits& device, const DecodePolicy& policy,
                                    const ClustersFit& clusters_fit);

}  // namespace microllm::paged_plan
