// The paged attention kernels' plans (paged_decode_plan.h): pure host arithmetic, tested on the CPU.
#include "paged_decode_plan.h"

#include <algorithm>
#include <optional>
#include <sstream>

namespace microllm::paged_plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

int group_of(const DecodeShape& s) { return s.q_heads / s.kv_heads; }

// The staged kernel's 16-byte copies need unit stride along D and every row 16-byte aligned; its key-slice
// shuffles need D / 8 to divide a warp (D = 8, 16, ..., 256). Then the grid's x extent (one query head a CTA at
// most: tokens x q heads) and the combine kernel's split limit.
bool staged_fits(const DecodeShape& s) {
  const bool dim_ok = s.dim % 8 == 0 && s.dim <= kMaxFastDim && s.dim >= 8 && 32 % (s.dim / 8) == 0;
  return dim_ok && s.aligned_pools && s.tokens * s.q_heads < (int64_t{1} << 31) && ceil_div(s.keys(), 32) <= kMaxSplits;
}

// A staged key's row pitch in elements (its K or V row and 16 bytes, so rows start on other banks) and the bytes
// of its K and V rows together.
int staged_pitch(const DecodeShape& s) { return s.dim + 16 / s.element_bytes; }
int64_t staged_key_bytes(const DecodeShape& s) { return 2 * int64_t{staged_pitch(s)} * s.element_bytes; }

// The staged kernels' common shared memory for `chunk` keys a CTA of R rows (the staged K/V rows, which the
// cross-warp sums reuse, then f32 q, scores, m, l, and a flag a key): sets chunk, pitch and stage_bytes.
size_t size_staged(DecodePlan& p, const DecodeShape& s, int R, int64_t chunk) {
  p.pitch = staged_pitch(s);
  p.chunk = static_cast<int>(chunk);
  p.stage_bytes = static_cast<int>(
      round_up(std::max<int64_t>(chunk * staged_key_bytes(s), int64_t{kStagedWarps} * R * s.dim * 4), 16));
  return static_cast<size_t>(p.stage_bytes) + static_cast<size_t>(R * (s.dim + chunk) + 2 * R + chunk) * sizeof(float);
}

// The most keys a CTA of R rows stages at once: kMaxChunk, or fewer where a key's rows are long (D 256: 128 keys
// for one row a CTA).
int64_t chunk_cap(const DecodeShape& s, int R) {
  const int64_t budget = R == 1 ? kStageBudgetAlone : kStageBudget;
  return std::max<int64_t>(32, std::min<int64_t>(kMaxChunk, budget / staged_key_bytes(s)) / 32 * 32);
}

// The staged kernel's key loop for R rows a CTA, from what the host knows only (tokens, heads, keys(): max_context
// or the window): the same grid on every replay. One split when the keys fit a chunk (no combine); past it, splits
// that give the grid kSplitCtasPerSm CTAs an SM, each at least kMinSplitChunk keys.
size_t plan_staged(DecodePlan& p, const DecodeShape& s, int R, int sms) {
  p.rows_per_cta = R;
  p.row_blocks = static_cast<int>(ceil_div(group_of(s), R));
  const int64_t cap = chunk_cap(s, R);
  const int64_t base_ctas = s.tokens * s.kv_heads * p.row_blocks;
  int64_t chunk = cap;
  if (s.keys() <= cap) {
    chunk = round_up(s.keys(), 32);
  } else {
    const int64_t want_splits = std::max<int64_t>(1, ceil_div(int64_t{kSplitCtasPerSm} * sms, base_ctas));
    chunk =
        std::clamp<int64_t>(round_up(ceil_div(s.keys(), want_splits), 32), std::min<int64_t>(kMinSplitChunk, cap), cap);
  }
  p.n_split = static_cast<int>(ceil_div(s.keys(), chunk));
  return size_staged(p, s, R, chunk);
}

// Rows per CTA: a whole GQA group (up to 8 query heads share each staged key) when the grid fills the GPU anyway,
// through many tokens or a long context's splits; one query head per CTA when tokens x kv heads is small and the
// context fits one such CTA's chunk (a batch-1 decode step: 2 CTAs of 8 rows on 132 SMs otherwise), so each CTA does
// an eighth of the score and P.V work and the group's heads run side by side (their shared K/V rows come from L2).
// Past that chunk (D 256 past 128 keys) the splits would cost a combine: for the tokens a cluster kernel takes
// (kMaxProjectedTokens), the group's rows stay together instead, where a token's cluster takes the keys in slices;
// more tokens keep one head a CTA up to kMaxChunk keys (Gemma 3 at batch 8: 4x the CTAs of whole groups).
bool one_head_per_cta(const DecodeShape& s, int sms) {
  const int64_t grouped_ctas = s.tokens * s.kv_heads * ceil_div(group_of(s), kRowsPerCta);
  const int64_t keys_limit = s.tokens <= kMaxProjectedTokens ? chunk_cap(s, 1) : int64_t{kMaxChunk};
  return group_of(s) > 1 && grouped_ctas < sms && s.keys() <= keys_limit;
}

// The o projection's share of a token's work in a cluster kernel of cluster_ctas CTAs: `replicas` clusters a token
// (grid y), each CTA computing o_cols columns. The most replicas (up to kMaxReplicas) that keep tokens x
// clusters_a_token x cluster_ctas x replicas CTAs within max_ctas with at most staged_budget bytes of rows a CTA,
// copied into shared memory before the kernel's wait; else one cluster a token streaming its rows through L2 (at
// most kMaxStreamedProjection a CTA). Returns the staged bytes a CTA (0: streamed), or -1 where the rows fit
// neither budget. row_elements: a row's length (o_in, or for head clusters a kv head's part of it).
int64_t plan_projection(DecodePlan& p, const DecodeShape& s, const DecodePolicy& policy, int64_t max_ctas,
                        int64_t cluster_ctas, int64_t staged_budget, int64_t row_elements, int64_t clusters_a_token) {
  const int64_t row_bytes = row_elements * s.element_bytes;
  auto cols_for = [&](int64_t r) { return ceil_div(s.hidden, cluster_ctas * r); };
  int replicas = policy.forced_replicas;
  if (replicas == 0) {
    replicas = 1;
    for (int r = 2; r <= kMaxReplicas && s.tokens * clusters_a_token * cluster_ctas * r <= max_ctas; ++r) {
      if (cols_for(r) * row_bytes <= staged_budget) replicas = r;
    }
  }
  p.replicas = replicas;
  p.o_cols = static_cast<int>(cols_for(replicas));
  p.rows_staged = replicas > 1;
  const int64_t rows_bytes = p.o_cols * row_bytes;
  if (rows_bytes > (replicas > 1 ? staged_budget : kMaxStreamedProjection)) return -1;
  return replicas > 1 ? rows_bytes : 0;
}

bool clusters_allowed(const DecodeShape& s, const DeviceLimits& d, const DecodePolicy& policy) {
  return policy.fuse_projection && d.compute_capability >= 90 && s.tokens <= kMaxProjectedTokens;
}

// One split with one query head a CTA, the token's query heads a cluster (grid y: the replica), the projection in
// the same kernel.
std::optional<DecodePlan> projected(const DecodeShape& s, const DeviceLimits& d, const DecodePolicy& policy,
                                    const ClustersFit& fits) {
  if (!clusters_allowed(s, d, policy) || !one_head_per_cta(s, d.sms) || s.q_heads > kMaxClusterCtas) return {};
  DecodePlan p;
  p.kernel = DecodeKernel::projected;
  const size_t base = plan_staged(p, s, 1, d.sms);
  const int64_t staged = plan_projection(p, s, policy, d.sms / 2, s.q_heads, kMaxStagedProjection, s.o_in, 1);
  if (staged < 0 || p.n_split != 1 || p.o_cols > 32 * kStagedWarps) return {};  // project_rows: a lane a row
  p.proj_offset = static_cast<int>(round_up(static_cast<int64_t>(base), 16));
  p.smem = static_cast<size_t>(p.proj_offset + int64_t{s.dim + s.o_in} * s.element_bytes + staged);
  if (static_cast<int64_t>(p.smem) > d.max_smem_optin) return {};
  p.cluster = static_cast<unsigned>(s.q_heads);
  p.grid_x = s.tokens * s.q_heads;
  p.grid_y = p.replicas;
  p.threads = kStagedThreads;
  if (!fits(p)) return {};
  return p;
}

// The cluster kernels' plan once their slices are chosen (p's kernel and slices set): chunk keys of kRowsPerCta rows
// staged a CTA, then o's sums, the head and the projection's input (x_len elements: o_in, or a kv head's part of
// it), then the projection's rows within the room left; clusters of cluster_ctas CTAs, clusters_a_token a token.
// The arrival counters bound head clusters' tokens x CTAs x replicas (a token's cluster stays within them anyway).
std::optional<DecodePlan> cluster_plan(DecodePlan p, const DecodeShape& s, const DeviceLimits& d,
                                       const DecodePolicy& policy, const ClustersFit& fits, int64_t chunk,
                                       int64_t x_len, int64_t cluster_ctas, int64_t clusters_a_token) {
  p.rows_per_cta = kRowsPerCta;
  const size_t regions = size_staged(p, s, kRowsPerCta, chunk) + size_t{kRowsPerCta} * s.dim * sizeof(float);
  const int64_t proj_offset = round_up(static_cast<int64_t>(regions), 16);
  const int64_t heads_bytes = (s.dim + x_len) * s.element_bytes;
  const int64_t room = d.max_smem_optin - proj_offset - heads_bytes;
  if (room < 0) return {};
  const int64_t staged = plan_projection(p, s, policy, d.sms / 2, cluster_ctas, std::min(room, kMaxStagedProjection),
                                         x_len, clusters_a_token);
  if (staged < 0 || p.o_cols > 32 * kStagedWarps) return {};  // project_rows: a lane a row
  if (s.tokens * cluster_ctas * p.replicas > kMaxArrivalCounters) return {};
  p.proj_offset = static_cast<int>(proj_offset);
  p.smem = static_cast<size_t>(proj_offset + heads_bytes + staged);
  p.cluster = static_cast<unsigned>(cluster_ctas);
  p.grid_x = s.tokens * clusters_a_token * cluster_ctas;
  p.grid_y = p.replicas;
  p.threads = kStagedThreads;
  if (!fits(p)) return {};
  return p;
}

// Past one chunk: a token's kv heads x slices in one cluster with a CTA for every query head, a slice of at most
// kMaxTokenClusterChunk keys on the tensor cores (kMaxChunk on the CUDA cores), staged whole. Replicas within half
// the SMs: each repeats the token's attention, and they sit beside the qkv kernel's CTAs.
std::optional<DecodePlan> token_cluster(const DecodeShape& s, const DeviceLimits& d, const DecodePolicy& policy,
                                        const ClustersFit& fits) {
  if (!clusters_allowed(s, d, policy) || !policy.token_clusters || group_of(s) > kRowsPerCta ||
      one_head_per_cta(s, d.sms)) {
    return {};
  }
  const int slices = kMaxClusterCtas / s.kv_heads;
  if (slices < group_of(s)) return {};  // CTA h merges query head h: a CTA for every query head
  const int64_t chunk = round_up(ceil_div(s.keys(), slices), 32);
  if (chunk > (s.tensor_cores ? kMaxTokenClusterChunk : int64_t{kMaxChunk})) return {};
  DecodePlan p;
  p.kernel = DecodeKernel::token_cluster;
  p.slices = slices;
  return cluster_plan(p, s, d, policy, fits, chunk, s.o_in, int64_t{s.kv_heads} * slices, 1);
}

// Past a token's cluster (a slice past its limit, e.g. a 4,096-key graph with 2 kv heads): clusters of
// kMaxClusterCtas slices of one kv head, kv_heads clusters a token, each projecting its heads' part of the input and
// the last to arrive summing the parts. Up to 2 tokens on the tensor cores, 1 on the CUDA cores (two lost to the
// splits there), at least 2 kv heads, a slice within one chunk: up to 4,096 keys.
std::optional<DecodePlan> head_clusters(const DecodeShape& s, const DeviceLimits& d, const DecodePolicy& policy,
                                        const ClustersFit& fits) {
  if (!clusters_allowed(s, d, policy) || !policy.head_clusters || s.tokens > (s.tensor_cores ? 2 : 1) ||
      group_of(s) > kRowsPerCta || s.kv_heads < 2 || one_head_per_cta(s, d.sms)) {
    return {};
  }
  const int slices = kMaxClusterCtas;
  if (slices < group_of(s)) return {};  // CTA h merges query head h of its kv head
  const int64_t chunk = round_up(ceil_div(s.keys(), slices), 32);
  if (chunk > kMaxChunk) return {};
  DecodePlan p;
  p.kernel = DecodeKernel::head_clusters;
  p.slices = slices;
  const int64_t x_len = int64_t{group_of(s)} * s.dim;  // a kv head's part of o_in: the projection's input
  return cluster_plan(p, s, d, policy, fits, chunk, x_len, slices, s.kv_heads);
}

// Several splits of whole GQA groups, then paged_combine_projected_kernel in place of the combine and the o GEMV:
// clusters of q_heads CTAs merging a token's heads, replicas within all the SMs (a replica repeats only the merge).
std::optional<DecodePlan> split_projected(const DecodeShape& s, const DeviceLimits& d, const DecodePolicy& policy,
                                          const ClustersFit& fits) {
  if (!clusters_allowed(s, d, policy) || s.q_heads > kMaxClusterCtas || one_head_per_cta(s, d.sms)) return {};
  DecodePlan p;
  p.kernel = DecodeKernel::split_projected;
  p.smem = plan_staged(p, s, kRowsPerCta, d.sms);
  const int64_t staged = plan_projection(p, s, policy, d.sms, s.q_heads, kMaxStagedProjection, s.o_in, 1);
  if (p.n_split == 1 || staged < 0 || p.o_cols > 32 * (kSmallThreads / 32)) return {};
  p.proj_offset = static_cast<int>(round_up(static_cast<int64_t>(p.n_split + 32) * 4, 16));
  p.combine_smem = static_cast<size_t>(p.proj_offset + int64_t{s.dim + s.o_in} * s.element_bytes + staged);
  p.cluster = static_cast<unsigned>(s.q_heads);
  p.grid_x = s.tokens * s.kv_heads * p.row_blocks;
  p.grid_y = p.n_split;
  p.threads = kStagedThreads;
  p.combine_grid_x = s.tokens * s.q_heads;
  p.combine_grid_y = p.replicas;
  if (static_cast<int64_t>(p.combine_smem) > d.max_smem_optin || !fits(p)) return {};
  return p;
}

}  // namespace

const char* kernel_name(DecodeKernel kernel) {
  switch (kernel) {
    case DecodeKernel::simple: return "simple";
    case DecodeKernel::staged: return "staged";
    case DecodeKernel::projected: return "projected";
    case DecodeKernel::token_cluster: return "token_cluster";
    case DecodeKernel::head_clusters: return "head_clusters";
    case DecodeKernel::split_projected: return "split_projected";
    case DecodeKernel::composition: return "composition";
  }
  return "?";
}

std::string DecodePlan::describe() const {
  std::ostringstream out;
  out << kernel_name(kernel);
  if (kernel == DecodeKernel::composition) return out.str();
  out << ": grid " << grid_x << "x" << grid_y << " of " << threads << " threads, " << smem << " B shared";
  if (cluster > 0) out << ", clusters of " << cluster;
  if (kernel == DecodeKernel::simple) return out.str();
  out << "; " << rows_per_cta << (rows_per_cta == 1 ? " row" : " rows") << " a CTA, chunk " << chunk;
  if (slices > 0) out << ", " << slices << " slices a kv head";
  if (n_split > 1 && slices == 0) out << ", " << n_split << " splits + combine";
  if (kernel != DecodeKernel::staged) {
    out << "; o projection: " << replicas << (replicas == 1 ? " replica" : " replicas") << " x " << o_cols
        << " columns a CTA, rows " << (rows_staged ? "staged" : "streamed");
  }
  return out.str();
}

DecodePlan plan_attention(const DecodeShape& shape, const DeviceLimits& device, DecodeKernel fallback) {
  DecodePlan p;
  if (!staged_fits(shape)) {
    p.kernel = fallback;
    if (fallback == DecodeKernel::simple) {
      p.grid_x = shape.tokens * shape.q_heads;
      p.threads = kSmallThreads;
      p.smem = kSimpleKeys * sizeof(int64_t) + static_cast<size_t>(2 * shape.dim + kSimpleKeys + 32) * sizeof(float);
    }
    return p;
  }
  p.kernel = DecodeKernel::staged;
  p.smem = plan_staged(p, shape, one_head_per_cta(shape, device.sms) ? 1 : kRowsPerCta, device.sms);
  p.grid_x = shape.tokens * shape.kv_heads * p.row_blocks;
  p.grid_y = p.n_split;
  p.threads = kStagedThreads;
  if (p.n_split > 1) {
    p.combine_grid_x = std::min<int64_t>(shape.tokens * shape.q_heads, int64_t{1} << 20);
    p.combine_grid_y = 1;
    p.combine_smem = static_cast<size_t>(p.n_split + 32) * sizeof(float);
  }
  return p;
}

DecodePlan plan_attention_projected(const DecodeShape& shape, const DeviceLimits& device, const DecodePolicy& policy,
                                    const ClustersFit& clusters_fit) {
  if (shape.element_bytes == 2 && shape.aligned_weight && staged_fits(shape)) {
    for (auto candidate : {projected, token_cluster, head_clusters, split_projected}) {
      if (std::optional<DecodePlan> plan = candidate(shape, device, policy, clusters_fit)) return *plan;
    }
  }
  return DecodePlan{};  // composition
}

}  // namespace microllm::paged_plan
