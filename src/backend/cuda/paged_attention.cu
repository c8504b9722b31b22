// CUDA paged attention (include/microllm/ops/paged_attention.h), host side: the staged kernel's plan (rows a
// CTA, chunk, splits) from what the host knows, the policies for the fused o projection (clusters, replicas),
// the launches, and the backend's entry points. The kernels and their design are in paged_kernels.cuh.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "../environment.h"
#include "cuda_backend.h"
#include "op_scope.h"
#include "paged_attention.h"
#include "paged_kernels.cuh"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels::paged {
namespace {

constexpr int kRowsPerCta = 8;  // query heads per CTA (of one kv head); 1 when the grid would be small
constexpr int kMaxChunk = 256;
constexpr int kMinSplitChunk = 64;
// Past one chunk the splits aim at this many CTAs per SM (paged_kernels.cuh's header comment): a split of 128 keys
// stages its rows in one round trip as a split of 64 does, and the combine merges half as many
// (docs/perf/kernels.md#paged-attention has the measurements behind this file's constants).
constexpr int kSplitCtasPerSm = 1;
constexpr int64_t kStageBudget = 96 * 1024;        // bytes of staged K and V rows per CTA (2 CTAs fit an SM)
constexpr int64_t kStageBudgetAlone = 144 * 1024;  // one query head per CTA (a small grid): one CTA per SM is
                                                   // fine, and 256 keys of D 128 fit one split (no combine)
constexpr int kMaxStagedSmem = 160 * 1024;  // the staged kernel's shared memory at most: the budget + its f32 rows
constexpr int kMaxSplits = 8192;            // the combine kernel keeps one weight per split in shared memory
// paged_decode_attention_projected's one kernel (kProject) takes at most this many tokens, and a CTA at most this
// many bytes of o_weight: staged in shared memory (replicated clusters) or streamed through L2 (one cluster a
// token; plan_projection). Past 2 tokens the clusters each read all of o_weight through a few SMs, and past these
// budgets (R1-Distill-1.5B's rows) the o GEMV on its own is faster.
constexpr int64_t kMaxProjectedTokens = 2;
constexpr int64_t kMaxStagedProjection = 64 << 10;
constexpr int64_t kMaxStreamedProjection = 128 << 10;
// Replicated clusters a token at most (MICROLLM_ATTENTION_O_REPLICAS's limit too).
constexpr int kMaxReplicas = detail::kMaxAttentionOReplicas;
constexpr int kMaxClusterCtas = 16;  // sm_90's largest (non-portable) thread-block cluster

// The staged kernel's 16-byte copies need unit stride along D and every row 16-byte aligned; its key-slice
// shuffles need D / 8 to divide a warp (D = 8, 16, ..., 256).
bool fast_layout(const Tensor& pool) {
  const int64_t dim = pool.size(3);
  return dim % 8 == 0 && dim <= kMaxFastDim && 32 % (dim / 8) == 0 && rows::rows_aligned16(pool);
}

// Whether the staged kernel takes these shapes: both pools' layouts, the grid's x extent (tokens x kv heads x
// row blocks) and the combine kernel's split limit; otherwise the simple kernel (or, fused, the separate ops).
bool staged_fits(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, int64_t max_context) {
  // The largest grid x: one query head per CTA (tokens x q heads).
  return fast_layout(k_pool) && fast_layout(v_pool) && q.size(0) * q.size(1) < (int64_t{1} << 31) &&
         (max_context + 31) / 32 <= kMaxSplits;
}

// A staged key's row pitch in elements (its K or V row and 16 bytes, so rows start on other banks) and the bytes
// of its K and V rows together.
template <typename T>
int staged_pitch(int dim) {
  return dim + static_cast<int>(16 / sizeof(T));
}
template <typename T>
int64_t staged_key_bytes(int dim) {
  return 2 * int64_t{staged_pitch<T>(dim)} * static_cast<int64_t>(sizeof(T));
}

// The staged kernels' common shared memory for `chunk` keys a CTA of R rows (paged_kernels.cuh: the staged K/V rows,
// which the cross-warp sums reuse, then f32 q, scores, m, l, and a flag a key): sets a's chunk, pitch and
// stage_bytes, returns the bytes.
template <typename T, int R>
size_t size_staged(PagedArgs& a, int64_t chunk) {
  a.pitch = staged_pitch<T>(a.dim);
  const int64_t row_bytes = staged_key_bytes<T>(a.dim);
  a.chunk = static_cast<int>(chunk);
  a.stage_bytes =
      static_cast<int>(std::max<int64_t>(chunk * row_bytes, int64_t{kStagedWarps} * R * a.dim * 4) + 15) / 16 * 16;
  return static_cast<size_t>(a.stage_bytes) + (R * (a.dim + chunk) + 2 * R + chunk) * sizeof(float);
}

// The staged kernel's plan for R rows per CTA, from what the host knows only (tokens, heads, max_context): the
// same grid on every replay. Sets a's row_blocks, pitch, chunk, n_split and stage_bytes; returns the shared
// memory the kernel needs (without kProject's region).
template <typename T, int R>
size_t plan_staged(PagedArgs& a, int64_t tokens, int64_t max_context, int sms) {
  a.row_blocks = (a.group + R - 1) / R;
  const int64_t row_bytes = staged_key_bytes<T>(a.dim);
  const int64_t budget = R == 1 ? kStageBudgetAlone : kStageBudget;
  const int64_t cap = std::max<int64_t>(32, std::min<int64_t>(kMaxChunk, budget / row_bytes) / 32 * 32);
  const int64_t base_ctas = tokens * a.kv_heads * a.row_blocks;
  int64_t chunk = cap;
  if (max_context <= cap) {
    chunk = (max_context + 31) / 32 * 32;  // one split: no combine kernel
  } else {
    const int64_t want_splits = std::max<int64_t>(1, (kSplitCtasPerSm * sms + base_ctas - 1) / base_ctas);
    chunk = (max_context + want_splits - 1) / want_splits;
    chunk = std::clamp<int64_t>((chunk + 31) / 32 * 32, std::min<int64_t>(kMinSplitChunk, cap), cap);
  }
  a.n_split = static_cast<int>((max_context + chunk - 1) / chunk);
  return size_staged<T, R>(a, chunk);
}

// Calls f.template operator()<kDim>() with kDim = dim for the head dims the staged kernel is compiled for (its
// index arithmetic then folds to constants after the wait, on the decode step's critical path), else kDim = 0.
template <typename F>
void with_head_dim(int dim, F&& f) {
  if (dim == 64)
    f.template operator()<64>();
  else if (dim == 128)
    f.template operator()<128>();
  else
    f.template operator()<0>();
}

// Whether the staged kernels' CTAs of R rows compute their scores and P V on the tensor cores for this head dim
// (decode_mma.cuh), which moves the launch policies' limits below.
template <typename T, int R>
bool staged_on_tensor_cores(int dim) {
  bool on = false;
  with_head_dim(dim, [&]<int kDim>() { on = decode_phases::kStagedOnTensorCores<T, R, kDim>; });
  return on;
}

// The combine-projected kernel for `replicas` clusters a token: rows staged in shared memory past one.
template <typename T>
auto combine_projected_kernel(int replicas) {
  return replicas > 1 ? paged_combine_projected_kernel<T, true> : paged_combine_projected_kernel<T, false>;
}

// paged_attention (fresh == nullptr) and paged_decode_attention on the staged kernel (+ combine); with kProject
// (several splits, launch_split_projected's plan) the combine is paged_combine_projected_kernel, `projected_smem`
// bytes a CTA.
template <typename T, int R, bool kFused, bool kProject = false>
void launch_staged_rows(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                        cudaStream_t stream, size_t projected_smem = 0) {
  const int device = dev.index;
  const int64_t rows = tokens * a.q_heads;
  const size_t smem = plan_staged<T, R>(a, tokens, max_context, sms);
  const int64_t n_split = a.n_split;
  const dim3 grid(static_cast<unsigned>(tokens * a.kv_heads * a.row_blocks), static_cast<unsigned>(n_split));
  if (n_split == 1) {
    with_head_dim(a.dim, [&]<int kDim>() {
      raise_smem_limit<paged_staged_kernel<T, R, kDim, true, kFused>>(kMaxStagedSmem, device);
      launch_chained(paged_staged_kernel<T, R, kDim, true, kFused>, grid, kStagedThreads, smem, stream, device, a,
                     freq);
    });
    return;
  }
  const Tensor part_o = Tensor::empty({rows * n_split * a.dim}, DType::f32, dev);
  const Tensor part_m = Tensor::empty({rows * n_split}, DType::f32, dev);
  const Tensor part_l = Tensor::empty({rows * n_split}, DType::f32, dev);
  a.part_o = part_o.data<float>();
  a.part_m = part_m.data<float>();
  a.part_l = part_l.data<float>();
  with_head_dim(a.dim, [&]<int kDim>() {
    raise_smem_limit<paged_staged_kernel<T, R, kDim, false, kFused>>(kMaxStagedSmem, device);
    launch_chained(paged_staged_kernel<T, R, kDim, false, kFused>, grid, kStagedThreads, smem, stream, device, a, freq);
  });
  if constexpr (kProject) {
    const dim3 combine_grid(static_cast<unsigned>(rows), static_cast<unsigned>(a.replicas));
    launch_chained_in_clusters(static_cast<unsigned>(a.q_heads), combine_projected_kernel<T>(a.replicas), combine_grid,
                               kSmallThreads, projected_smem, stream, device, a);
    return;
  }
  const size_t combine_smem = (n_split + 32) * sizeof(float);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
  launch_chained(paged_combine_kernel<T>, blocks, kSmallThreads, combine_smem, stream, device, a, rows);
}

// Rows per CTA: a whole GQA group (up to 8 query heads share each staged key) when the grid fills the GPU
// anyway, through many tokens or a long context's splits; one query head per CTA when tokens x kv heads is
// small and the context fits one chunk (a batch-1 decode step: 2 CTAs of 8 rows on 132 SMs otherwise), so
// each CTA does an eighth of the score and P.V work and the group's heads run side by side (the K/V rows they
// share come from L2 after the first).
bool one_head_per_cta(const PagedArgs& a, int64_t tokens, int64_t max_context, int sms) {
  const int64_t grouped_ctas = tokens * a.kv_heads * ((a.group + kRowsPerCta - 1) / kRowsPerCta);
  return a.group > 1 && grouped_ctas < sms && max_context <= kMaxChunk;
}

template <typename T, bool kFused>
void launch_staged(const PagedArgs& a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                   cudaStream_t stream) {
  if (one_head_per_cta(a, tokens, max_context, sms)) {
    launch_staged_rows<T, 1, kFused>(a, freq, tokens, max_context, sms, dev, stream);
  } else {
    launch_staged_rows<T, kRowsPerCta, kFused>(a, freq, tokens, max_context, sms, dev, stream);
  }
}

std::atomic<int64_t> g_projected_launches{0};

// MICROLLM_DISABLE=attention-o keeps the o projection in its own kernel (an A/B switch); read once.
bool projection_fused() {
  static const bool on = !detail::path_disabled(detail::FastPath::attention_o);
  return on;
}

// The o projection's share of a token's work when it rides in a cluster kernel of cluster_ctas CTAs: `replicas`
// clusters a token (grid y), each CTA computing o_cols columns. The most replicas (up to kMaxReplicas) that keep
// tokens x cluster_ctas x replicas CTAs within max_ctas with at most staged_budget bytes of rows a CTA, copied into
// shared memory before the kernel's wait; else one cluster a token streaming its rows through L2 (at most
// kMaxStreamedProjection a CTA). Sets a.replicas and a.o_cols; returns the staged bytes a CTA (0: streamed), or
// -1 where the rows fit neither budget. max_ctas: half the SMs for the one-kernel path, whose replicas each
// compute the token's attention again and sit beside the qkv kernel's CTAs; all of them past one split, where a
// replica repeats only the merge of a head's splits (partials read from L2). On Qwen2.5-0.5B this gives 4 replicas
// at batch 1 and 2 at batch 2 (docs/perf/kernels.md#paged-attention: the sweeps).
// MICROLLM_ATTENTION_O_REPLICAS=R (1..kMaxReplicas) forces R (for tests and sweeps; read once).
// Head clusters (launch_head_clusters) pass the rows' length in elements (a kv head's part of o_in) and their
// clusters a token, which compute the same columns.
int64_t plan_projection(PagedArgs& a, int64_t tokens, int64_t element_bytes, int64_t max_ctas, int64_t cluster_ctas,
                        int64_t staged_budget = kMaxStagedProjection, int64_t row_elements = 0,
                        int64_t clusters_a_token = 1) {
  static const int forced = detail::attention_o_replicas_from_environment();
  const int64_t row_bytes = (row_elements > 0 ? row_elements : int64_t{a.o_in}) * element_bytes;
  auto cols_for = [&](int64_t r) { return (a.hidden + cluster_ctas * r - 1) / (cluster_ctas * r); };
  int replicas = forced;
  if (replicas == 0) {
    replicas = 1;
    for (int r = 2; r <= kMaxReplicas && tokens * clusters_a_token * cluster_ctas * r <= max_ctas; ++r) {
      if (cols_for(r) * row_bytes <= staged_budget) replicas = r;
    }
  }
  a.replicas = replicas;
  a.o_cols = static_cast<int>(cols_for(replicas));
  const int64_t rows_bytes = a.o_cols * row_bytes;
  if (rows_bytes > (replicas > 1 ? staged_budget : kMaxStreamedProjection)) return -1;
  return replicas > 1 ? rows_bytes : 0;
}

// Whether clusters of `cluster` CTAs of `kernel` with `smem` bytes each can run on `device` (a GPC must hold
// them at once); asked once per (kernel, device, cluster, smem).
template <typename Kernel>
bool clusters_fit(Kernel kernel, int device, unsigned cluster, size_t smem, int threads = kStagedThreads) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, unsigned, size_t>, bool> answers;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::tuple{reinterpret_cast<const void*>(kernel), device, cluster, smem};  // one block size each
  if (const auto it = answers.find(key); it != answers.end()) return it->second;
  MICROLLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_memory_optin(device)));
  MICROLLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim = {cluster, 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int active = 0;
  MICROLLM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&active, kernel, &config));
  return answers[key] = active > 0;
}

// paged_decode_attention_projected in one kernel (kProject): where launch_staged would take one query head per
// CTA and one split, the token's query heads fit a cluster (at most 16 CTAs) that the GPU can hold, and within
// kMaxProjectedTokens and kMaxStagedProjection / kMaxStreamedProjection. Returns false, having launched nothing,
// anywhere else.
template <typename T>
bool launch_projected(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, int device,
                      cudaStream_t stream) {
  if (!projection_fused() || compute_capability(device) < 90 || tokens > kMaxProjectedTokens ||
      !one_head_per_cta(a, tokens, max_context, sms) || a.q_heads > kMaxClusterCtas) {
    return false;
  }
  const size_t base = plan_staged<T, 1>(a, tokens, max_context, sms);
  const int64_t staged = plan_projection(a, tokens, sizeof(T), sms / 2, a.q_heads);
  if (staged < 0 || a.n_split != 1 || a.o_cols > 32 * kStagedWarps) return false;  // project_rows: a lane a row
  a.proj_offset = static_cast<int>((base + 15) / 16 * 16);
  const size_t smem = static_cast<size_t>(a.proj_offset) + static_cast<size_t>(a.dim + a.o_in) * sizeof(T) +
                      static_cast<size_t>(staged);
  if (smem > static_cast<size_t>(max_shared_memory_optin(device))) return false;
  void (*kernel)(PagedArgs, RopeFreq) = nullptr;
  with_head_dim(a.dim, [&]<int kDim>() {
    kernel = staged > 0 ? paged_staged_kernel<T, 1, kDim, true, true, true, true>
                        : paged_staged_kernel<T, 1, kDim, true, true, true, false>;
  });
  const auto cluster = static_cast<unsigned>(a.q_heads);
  if (!clusters_fit(kernel, device, cluster, smem)) return false;
  const OpScope scope("paged_decode_attention_projected", device, stream);  // declined calls time their own ops
  const dim3 grid(static_cast<unsigned>(tokens * a.q_heads), static_cast<unsigned>(a.replicas));
  launch_chained_in_clusters(cluster, kernel, grid, kStagedThreads, smem, stream, device, a, freq);
  g_projected_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// paged_decode_attention_projected past one split: where launch_staged's plan has several splits (a context past
// one chunk), at most kMaxProjectedTokens tokens whose query heads fit a cluster, and each CTA's o_cols rows fit
// their budget (plan_projection, replicas within all the SMs): the splits, then paged_combine_projected_kernel in
// place of the combine kernel and the o GEMV. Returns false, having launched nothing, anywhere else.
template <typename T>
bool launch_split_projected(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                            cudaStream_t stream) {
  const int device = dev.index;
  if (!projection_fused() || compute_capability(device) < 90 || tokens > kMaxProjectedTokens ||
      a.q_heads > kMaxClusterCtas || one_head_per_cta(a, tokens, max_context, sms)) {
    return false;  // (one head a CTA: one split, launch_projected's)
  }
  PagedArgs plan = a;
  plan_staged<T, kRowsPerCta>(plan, tokens, max_context, sms);
  const int64_t staged = plan_projection(a, tokens, sizeof(T), sms, a.q_heads);
  if (plan.n_split == 1 || staged < 0 || a.o_cols > 32 * (kSmallThreads / 32)) return false;
  a.proj_offset = static_cast<int>(((plan.n_split + 32) * sizeof(float) + 15) / 16 * 16);
  const size_t smem = static_cast<size_t>(a.proj_offset) + static_cast<size_t>(a.dim + a.o_in) * sizeof(T) +
                      static_cast<size_t>(staged);
  const auto cluster = static_cast<unsigned>(a.q_heads);
  if (smem > static_cast<size_t>(max_shared_memory_optin(device)) ||
      !clusters_fit(combine_projected_kernel<T>(a.replicas), device, cluster, smem, kSmallThreads)) {
    return false;
  }
  const OpScope scope("paged_decode_attention_projected", device, stream);
  launch_staged_rows<T, kRowsPerCta, true, true>(a, freq, tokens, max_context, sms, dev, stream, smem);
  g_projected_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::atomic<int64_t> g_token_cluster_launches{0};

// MICROLLM_DISABLE=attention-cluster (read once) or set_token_clusters(false) keeps launch_token_cluster out: an A/B
// switch.
std::atomic<bool>& token_clusters_flag() {
  static std::atomic<bool> flag{!detail::path_disabled(detail::FastPath::attention_cluster)};
  return flag;
}

// paged_decode_attention_projected past one split in one kernel (paged_token_cluster_kernel): where a context past
// one chunk would take the splits and their merge, at most kMaxProjectedTokens tokens, a GQA group within one CTA's
// rows, the token's kv heads x slices within a cluster with a CTA for every query head, and a slice of max_context
// of at most kMaxTokenClusterChunk keys where the phases run on the tensor cores (a 4,096-key graph for 2 kv heads),
// kMaxChunk on the CUDA cores, staged whole. Replicas (plan_projection) within half the SMs, as launch_projected's:
// each repeats the token's attention, and they sit beside the qkv kernel's CTAs. Returns false, having launched
// nothing, anywhere else.
// The slice limit: 512 keys on the tensor cores (a 4,096-key graph for 2 kv heads, where this kernel beats head
// clusters while the context fills half the graph: the target workload's case), kMaxChunk on the CUDA cores
// (slices of 512 keys staged there lost to the splits).
constexpr int64_t kMaxTokenClusterChunk = 512;
template <typename T>
bool launch_token_cluster(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, int device,
                          cudaStream_t stream) {
  constexpr int R = kRowsPerCta;
  if (!projection_fused() || !token_clusters_flag().load(std::memory_order_relaxed) ||
      compute_capability(device) < 90 || tokens > kMaxProjectedTokens || a.group > R ||
      one_head_per_cta(a, tokens, max_context, sms)) {
    return false;
  }
  const int slices = kMaxClusterCtas / a.kv_heads, ctas = a.kv_heads * slices;
  if (slices < a.group) return false;  // CTA h merges query head h: a CTA for every query head
  const int64_t chunk = ((max_context + slices - 1) / slices + 31) / 32 * 32;
  if (chunk > (staged_on_tensor_cores<T, R>(a.dim) ? kMaxTokenClusterChunk : kMaxChunk)) return false;
  a.slices = slices;
  const size_t regions_bytes = size_staged<T, R>(a, chunk) + R * a.dim * sizeof(float);  // and o's sums, po
  const int64_t proj_offset = static_cast<int64_t>(regions_bytes + 15) / 16 * 16;
  const int64_t heads_bytes = static_cast<int64_t>(a.dim + a.o_in) * static_cast<int64_t>(sizeof(T));
  const int64_t room = max_shared_memory_optin(device) - proj_offset - heads_bytes;
  if (room < 0) return false;
  const int64_t staged = plan_projection(a, tokens, sizeof(T), sms / 2, ctas, std::min(room, kMaxStagedProjection));
  if (staged < 0 || a.o_cols > 32 * kStagedWarps) return false;  // project_rows: a lane a row
  a.proj_offset = static_cast<int>(proj_offset);
  const size_t smem = static_cast<size_t>(proj_offset + heads_bytes + staged);
  void (*kernel)(PagedArgs, RopeFreq) = nullptr;
  with_head_dim(a.dim, [&]<int kDim>() {
    kernel = staged > 0 ? paged_token_cluster_kernel<T, R, kDim, true> : paged_token_cluster_kernel<T, R, kDim, false>;
  });
  if (!clusters_fit(kernel, device, static_cast<unsigned>(ctas), smem)) return false;
  const OpScope scope("paged_decode_attention_projected", device, stream);
  const dim3 grid(static_cast<unsigned>(tokens * ctas), static_cast<unsigned>(a.replicas));
  launch_chained_in_clusters(static_cast<unsigned>(ctas), kernel, grid, kStagedThreads, smem, stream, device, a, freq);
  g_projected_launches.fetch_add(1, std::memory_order_relaxed);
  g_token_cluster_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::atomic<int64_t> g_head_cluster_launches{0};

// MICROLLM_DISABLE=attention-head-cluster (read once) or set_head_clusters(false) keeps launch_head_clusters out: an
// A/B switch.
std::atomic<bool>& head_clusters_flag() {
  static std::atomic<bool> flag{!detail::path_disabled(detail::FastPath::attention_head_cluster)};
  return flag;
}

// The head clusters' arrival counters: kMaxArrivalCounters ints per (device, stream), zero between launches (the
// last arrival at each resets it), so that kernels on two streams never count on the same ones. Allocated and
// zeroed on first use, which may be inside a stream capture (relaxed mode: cudaMalloc and a private stream's
// memset are allowed there and are not captured). Never freed: a few hundred bytes a stream. A captured graph's
// launches keep the counters of the stream it was captured on: replaying it on another stream while that stream
// runs this kernel too would share them (the engine replays its graphs on their capture stream).
constexpr int64_t kMaxArrivalCounters = kMaxProjectedTokens * kMaxClusterCtas * kMaxReplicas;
int* arrival_counters(int device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  const std::lock_guard<std::mutex> lock(mutex);
  int*& slot = counters[{device, stream}];
  if (slot == nullptr) {
    const detail::CudaDeviceGuard guard(device);
    void* p = nullptr;
    MICROLLM_CUDA_CHECK(cudaMalloc(&p, kMaxArrivalCounters * sizeof(int)));
    cudaStream_t zeroing = nullptr;
    MICROLLM_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
    MICROLLM_CUDA_CHECK(cudaMemsetAsync(p, 0, kMaxArrivalCounters * sizeof(int), zeroing));
    MICROLLM_CUDA_CHECK(cudaStreamSynchronize(zeroing));
    MICROLLM_CUDA_CHECK(cudaStreamDestroy(zeroing));
    slot = static_cast<int*>(p);
  }
  return slot;
}

// paged_decode_attention_projected past a token's cluster (launch_token_cluster declined: a slice of max_context past
// one chunk, e.g. a 4,096-key graph with 2 kv heads) in one kernel: paged_token_cluster_kernel with kHeadClusters,
// clusters of kMaxClusterCtas slices of one kv head, kv_heads clusters a token, each projecting its heads' part of
// the input and the last of them to arrive summing the parts (merge_partial_columns). At most max_head_cluster_tokens
// tokens, at least 2 kv heads (one kv head is a token's cluster), a GQA group within a CTA's rows and a CTA for each
// of the group's query heads, and a slice within one chunk: up to 4,096 keys. Replicas (plan_projection) within half
// the SMs, as launch_token_cluster's. Returns false, having launched nothing, anywhere else.
// Tokens: up to 2 where the CTAs' phases run on the tensor cores, 1 on the CUDA cores (two tokens lost to the splits
// there; docs/perf/kernels.md#paged-attention).
template <typename T>
int64_t max_head_cluster_tokens(int dim) {
  return staged_on_tensor_cores<T, kRowsPerCta>(dim) ? 2 : 1;
}

template <typename T>
bool launch_head_clusters(PagedArgs a, const RopeFreq& freq, int64_t tokens, int64_t max_context, int sms, Device dev,
                          cudaStream_t stream) {
  constexpr int R = kRowsPerCta;
  const int device = dev.index;
  if (!projection_fused() || !head_clusters_flag().load(std::memory_order_relaxed) || compute_capability(device) < 90 ||
      tokens > max_head_cluster_tokens<T>(a.dim) || a.group > R || a.kv_heads < 2 ||
      one_head_per_cta(a, tokens, max_context, sms)) {
    return false;
  }
  const int slices = kMaxClusterCtas;
  if (slices < a.group) return false;  // CTA h merges query head h of its kv head
  const int64_t chunk = ((max_context + slices - 1) / slices + 31) / 32 * 32;
  if (chunk > kMaxChunk) return false;
  a.slices = slices;
  // x_len: a kv head's part of o_in, the projection's input in a cluster.
  const int64_t x_len = int64_t{a.group} * a.dim;
  const size_t regions_bytes = size_staged<T, R>(a, chunk) + R * a.dim * sizeof(float);  // and o's sums, po
  const int64_t proj_offset = static_cast<int64_t>(regions_bytes + 15) / 16 * 16;
  const int64_t heads_bytes = (a.dim + x_len) * static_cast<int64_t>(sizeof(T));
  const int64_t room = max_shared_memory_optin(device) - proj_offset - heads_bytes;
  if (room < 0) return false;
  const int64_t staged =
      plan_projection(a, tokens, sizeof(T), sms / 2, slices, std::min(room, kMaxStagedProjection), x_len, a.kv_heads);
  if (staged < 0 || a.o_cols > 32 * kStagedWarps) return false;  // project_rows: a lane a row
  if (tokens * slices * a.replicas > kMaxArrivalCounters) return false;
  a.proj_offset = static_cast<int>(proj_offset);
  const size_t smem = static_cast<size_t>(proj_offset + heads_bytes + staged);
  void (*kernel)(PagedArgs, RopeFreq) = nullptr;
  with_head_dim(a.dim, [&]<int kDim>() {
    kernel = staged > 0 ? paged_token_cluster_kernel<T, R, kDim, true, true>
                        : paged_token_cluster_kernel<T, R, kDim, false, true>;
  });
  if (!clusters_fit(kernel, device, static_cast<unsigned>(slices), smem)) return false;
  const OpScope scope("paged_decode_attention_projected", device, stream);
  const Tensor partial = Tensor::empty({tokens * a.kv_heads * a.hidden}, DType::f32, dev);
  a.proj_partial = partial.data<float>();
  a.proj_counters = arrival_counters(device, stream);
  const dim3 grid(static_cast<unsigned>(tokens * a.kv_heads * slices), static_cast<unsigned>(a.replicas));
  launch_chained_in_clusters(static_cast<unsigned>(slices), kernel, grid, kStagedThreads, smem, stream, device, a,
                             freq);
  g_projected_launches.fetch_add(1, std::memory_order_relaxed);
  g_head_cluster_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The arguments every attention kernel reads.
PagedArgs attention_args(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                         const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                         const Tensor& out, uint64_t* error_word) {
  PagedArgs a{};
  a.q = q.data_ptr();
  a.k_pool = k_pool.data_ptr();
  a.v_pool = v_pool.data_ptr();
  a.tables = block_tables.data<int32_t>();
  a.seq_ids = seq_ids.data<int32_t>();
  a.positions = positions.data<int32_t>();
  for (int d = 0; d < 3; ++d) a.q_stride[d] = q.stride(d);
  for (int d = 0; d < 4; ++d) {
    a.k_stride[d] = k_pool.stride(d);
    a.v_stride[d] = v_pool.stride(d);
  }
  a.table_stride[0] = block_tables.stride(0);
  a.table_stride[1] = block_tables.stride(1);
  a.seq_stride = seq_ids.stride(0);
  a.pos_stride = positions.stride(0);
  a.q_heads = static_cast<int>(q.size(1));
  a.kv_heads = static_cast<int>(k_pool.size(2));
  a.group = a.q_heads / a.kv_heads;
  a.dim = static_cast<int>(q.size(2));
  a.block_size = static_cast<int>(k_pool.size(1));
  a.num_blocks = static_cast<int>(std::min<int64_t>(k_pool.size(0), INT32_MAX));  // i32 block ids
  a.num_seqs = static_cast<int>(std::min<int64_t>(block_tables.size(0), INT32_MAX));
  a.max_context = static_cast<int>(max_context);  // the op checked it fits i32
  a.scale = static_cast<float>(scale);
  a.out = out.data_ptr();
  a.error_word = error_word;
  return a;
}

// A decode step's new k, v [N, Hkv, D] (before the rotary embedding), their slots and the rotary pairs.
void set_new_kv(PagedArgs& a, const Tensor& k, const Tensor& v, const Tensor& slots, const RopeParams& rope,
                int64_t dim) {
  a.k_new = k.data_ptr();
  a.v_new = v.data_ptr();
  for (int d = 0; d < 3; ++d) {
    a.k_new_stride[d] = k.stride(d);
    a.v_new_stride[d] = v.stride(d);
  }
  a.slots = slots.data<int32_t>();
  a.slot_stride = slots.stride(0);
  const bool split_half = rope.layout == RopeLayout::split_half;
  a.pair_step = split_half ? 1 : 2;
  a.partner = split_half ? static_cast<int>(dim / 2) : 1;
}

}  // namespace

int64_t projected_launches() { return g_projected_launches.load(std::memory_order_relaxed); }
int64_t token_cluster_launches() { return g_token_cluster_launches.load(std::memory_order_relaxed); }
bool token_clusters() { return token_clusters_flag().load(std::memory_order_relaxed); }
void set_token_clusters(bool enabled) { token_clusters_flag().store(enabled, std::memory_order_relaxed); }
int64_t head_cluster_launches() { return g_head_cluster_launches.load(std::memory_order_relaxed); }
bool head_clusters() { return head_clusters_flag().load(std::memory_order_relaxed); }
void set_head_clusters(bool enabled) { head_clusters_flag().store(enabled, std::memory_order_relaxed); }

}  // namespace cuda_kernels::paged

using namespace cuda_kernels;

void CudaBackend::paged_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                  const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                  double scale, int64_t max_context, const Tensor& out) {
  OpScope scope("paged_attention", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  namespace pg = paged;
  const pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context,
                                             out, detail::cuda_error_word(device_));
  const int64_t tokens = q.size(0);
  const bool fast = pg::staged_fits(q, k_pool, v_pool, max_context);
  visit_float(q.dtype(), "paged_attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      no_kernel("paged_attention", DType::f64);  // the op allows f32/f16/bf16 pools only
    } else if (fast) {
      pg::launch_staged<T, false>(a, pg::RopeFreq{}, tokens, max_context, multiprocessor_count(launch.device),
                                  out.device(), launch.stream);
    } else {
      const size_t smem = pg::kSimpleKeys * sizeof(int64_t) + (2 * a.dim + pg::kSimpleKeys + 32) * sizeof(float);
      if (smem > 48 * 1024) {
        MICROLLM_CUDA_CHECK(cudaFuncSetAttribute(pg::paged_simple_kernel<T>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      }
      pg::paged_simple_kernel<T>
          <<<static_cast<unsigned>(tokens * a.q_heads), pg::kSmallThreads, smem, launch.stream>>>(a);
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaFusions::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                         const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                         const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                         double scale, int64_t max_context, const Tensor& out) {
  namespace pg = paged;
  const int64_t tokens = q.size(0), dim = q.size(2);
  if (!pg::staged_fits(q, k_pool, v_pool, max_context)) {  // the separate ops, one after the other
    Fusions::paged_decode_attention(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                                    max_context, out);
    return;
  }
  OpScope scope("paged_decode_attention", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, out,
                                       detail::cuda_error_word(device_));
  pg::set_new_kv(a, k, v, slots, rope, dim);
  const pg::RopeFreq freq = rotary::inv_freq_arg<float, pg::kMaxFastDim / 2>(rope, dim);
  visit_float(q.dtype(), "paged_decode_attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      no_kernel("paged_decode_attention", DType::f64);
    } else {
      pg::launch_staged<T, true>(a, freq, tokens, max_context, multiprocessor_count(launch.device), out.device(),
                                 launch.stream);
    }
  });
}

// One kernel where launch_projected takes the shapes (16-bit weights in 16-byte aligned rows); otherwise the
// composition: paged_decode_attention, then the decode GEMV or cuBLASLt with the addend.
void CudaFusions::paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                                   const Tensor& slots, const Tensor& block_tables,
                                                   const Tensor& seq_ids, const Tensor& positions, double scale,
                                                   int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                                   const Tensor& out) {
  namespace pg = paged;
  const int64_t tokens = q.size(0), dim = q.size(2);
  const bool sixteen_bit = q.dtype() == DType::bf16 || q.dtype() == DType::f16;
  const bool weight_rows = rows::rows_aligned16(o_weight) && o_weight.size(1) % 8 == 0;  // whole 16-byte packs
  if (sixteen_bit && weight_rows && pg::staged_fits(q, k_pool, v_pool, max_context)) {
    Launch launch(out);
    pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, out,
                                         detail::cuda_error_word(device_));
    pg::set_new_kv(a, k, v, slots, rope, dim);
    a.out = nullptr;  // the attention's output stays in shared memory
    a.o_weight = o_weight.data_ptr();
    a.o_weight_stride = o_weight.stride(0);
    a.addend = addend.defined() ? addend.data_ptr() : nullptr;
    a.proj_out = out.data_ptr();
    a.hidden = static_cast<int>(o_weight.size(0));
    a.o_in = static_cast<int>(o_weight.size(1));
    const pg::RopeFreq freq = rotary::inv_freq_arg<float, pg::kMaxFastDim / 2>(rope, dim);
    bool launched = false;
    const int sms = multiprocessor_count(launch.device);
    if (q.dtype() == DType::bf16) {
      launched =
          pg::launch_projected<__nv_bfloat16>(a, freq, tokens, max_context, sms, launch.device, launch.stream) ||
          pg::launch_token_cluster<__nv_bfloat16>(a, freq, tokens, max_context, sms, launch.device, launch.stream) ||
          pg::launch_head_clusters<__nv_bfloat16>(a, freq, tokens, max_context, sms, out.device(), launch.stream) ||
          pg::launch_split_projected<__nv_bfloat16>(a, freq, tokens, max_context, sms, out.device(), launch.stream);
    } else {
      launched = pg::launch_projected<__half>(a, freq, tokens, max_context, sms, launch.device, launch.stream) ||
                 pg::launch_token_cluster<__half>(a, freq, tokens, max_context, sms, launch.device, launch.stream) ||
                 pg::launch_head_clusters<__half>(a, freq, tokens, max_context, sms, out.device(), launch.stream) ||
                 pg::launch_split_projected<__half>(a, freq, tokens, max_context, sms, out.device(), launch.stream);
    }
    if (launched) return;
  }
  Fusions::paged_decode_attention_projected(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions,
                                            scale, max_context, o_weight, addend, out);
}

}  // namespace microllm
