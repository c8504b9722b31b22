// CUDA paged attention (include/microllm/ops/paged_attention.h), host side: what the device and the switches tell
// the plan (src/backend/paged_decode_plan.h: which kernel, its launch shape), the one launch switch over the plan's
// kernel, and the backend's entry points. The kernels and their design are in paged_kernels.cuh.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "../environment.h"
#include "../paged_decode_plan.h"
#include "cuda_backend.h"
#include "microllm/backend/kernel_choices.h"
#include "op_scope.h"
#include "paged_attention.h"
#include "paged_kernels.cuh"
#include "rows.cuh"

namespace microllm {
namespace cuda_kernels::paged {
namespace {

using paged_plan::DecodeKernel;
using paged_plan::DecodePlan;
using paged_plan::kRowsPerCta;
static_assert(paged_plan::kMaxReplicas == detail::kMaxAttentionOReplicas, "one replica limit");

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

// Whether CTAs of kRowsPerCta rows compute their scores and P V on the tensor cores for this head dim
// (decode_mma.cuh), which moves the plan's limits for the cluster kernels.
template <typename T>
bool staged_on_tensor_cores(int dim) {
  bool on = false;
  with_head_dim(dim, [&]<int kDim>() { on = decode_phases::kStagedOnTensorCores<T, kRowsPerCta, kDim>; });
  return on;
}

// The staged kernel's 16-byte copies need unit stride along D and every row 16-byte aligned.
bool pool_rows_aligned(const Tensor& pool) { return pool.stride(3) == 1 && rows::rows_aligned16(pool); }

// What the plan reads of the operands: q [N, Hq, D], the pools [blocks, block_size, Hkv, D], o_weight [hidden, o_in]
// (undefined: attention alone).
template <typename T>
paged_plan::DecodeShape decode_shape(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, int64_t max_context,
                                     int64_t window, const Tensor& o_weight = Tensor()) {
  paged_plan::DecodeShape s;
  s.tokens = q.size(0);
  s.max_context = max_context;
  s.window = window;
  s.q_heads = static_cast<int>(q.size(1));
  s.kv_heads = static_cast<int>(k_pool.size(2));
  s.dim = static_cast<int>(q.size(2));
  s.element_bytes = static_cast<int>(sizeof(T));
  s.aligned_pools = pool_rows_aligned(k_pool) && pool_rows_aligned(v_pool);
  s.tensor_cores = staged_on_tensor_cores<T>(s.dim);
  if (o_weight.defined()) {
    s.hidden = static_cast<int>(o_weight.size(0));
    s.o_in = static_cast<int>(o_weight.size(1));
    s.aligned_weight = rows::rows_aligned16(o_weight) && o_weight.size(1) % 8 == 0;  // whole 16-byte packs
  }
  return s;
}

paged_plan::DeviceLimits device_limits(int device) {
  return {multiprocessor_count(device), compute_capability(device), max_shared_memory_optin(device)};
}

// MICROLLM_DISABLE=attention-cluster / attention-head-cluster (read once) or set_token_clusters / set_head_clusters
// keep those kernels out: A/B switches.
std::atomic<bool>& token_clusters_flag() {
  static std::atomic<bool> flag{!detail::path_disabled(detail::FastPath::attention_cluster)};
  return flag;
}
std::atomic<bool>& head_clusters_flag() {
  static std::atomic<bool> flag{!detail::path_disabled(detail::FastPath::attention_head_cluster)};
  return flag;
}

// The switches as the plan takes them: MICROLLM_DISABLE=attention-o keeps the o projection in its own kernel, and
// MICROLLM_ATTENTION_O_REPLICAS=R forces R replicas (tests and sweeps); both read once.
paged_plan::DecodePolicy decode_policy() {
  static const bool fuse_projection = !detail::path_disabled(detail::FastPath::attention_o);
  static const int forced_replicas = detail::attention_o_replicas_from_environment();
  return {fuse_projection, token_clusters_flag().load(std::memory_order_relaxed),
          head_clusters_flag().load(std::memory_order_relaxed), forced_replicas};
}

// The combine-projected kernel for `replicas` clusters a token: rows staged in shared memory past one.
template <typename T>
auto combine_projected_kernel(int replicas) {
  return replicas > 1 ? paged_combine_projected_kernel<T, true> : paged_combine_projected_kernel<T, false>;
}

// The clustered kernel of a projected, token_cluster or head_clusters plan.
template <typename T>
void (*cluster_kernel(const DecodePlan& p, int dim))(PagedArgs, RopeFreq) {
  void (*kernel)(PagedArgs, RopeFreq) = nullptr;
  with_head_dim(dim, [&]<int kDim>() {
    if (p.kernel == DecodeKernel::projected) {
      kernel = p.rows_staged ? paged_staged_kernel<T, 1, kDim, true, true, true, true>
                             : paged_staged_kernel<T, 1, kDim, true, true, true, false>;
    } else if (p.kernel == DecodeKernel::token_cluster) {
      kernel = p.rows_staged ? paged_token_cluster_kernel<T, kRowsPerCta, kDim, true>
                             : paged_token_cluster_kernel<T, kRowsPerCta, kDim, false>;
    } else {
      kernel = p.rows_staged ? paged_token_cluster_kernel<T, kRowsPerCta, kDim, true, true>
                             : paged_token_cluster_kernel<T, kRowsPerCta, kDim, false, true>;
    }
  });
  return kernel;
}

// Whether clusters of `cluster` CTAs of `kernel` with `smem` bytes each can run on `device` (a GPC must hold
// them at once); asked once per (kernel, device, cluster, smem).
template <typename Kernel>
bool clusters_fit(Kernel kernel, int device, unsigned cluster, size_t smem, int threads) {
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

// The plan's question of the device: whether its clustered kernel's clusters fit.
template <typename T>
paged_plan::ClustersFit clusters_fit_on(int device, int dim) {
  return [device, dim](const DecodePlan& p) {
    if (p.kernel == DecodeKernel::split_projected) {
      return clusters_fit(combine_projected_kernel<T>(p.replicas), device, p.cluster, p.combine_smem,
                          paged_plan::kSmallThreads);
    }
    return clusters_fit(cluster_kernel<T>(p, dim), device, p.cluster, p.smem, p.threads);
  };
}

// The head clusters' arrival counters: kMaxArrivalCounters ints per (device, stream), zero between launches (the
// last arrival at each resets it), so that kernels on two streams never count on the same ones. Allocated and
// zeroed on first use, which may be inside a stream capture (relaxed mode: cudaMalloc and a private stream's
// memset are allowed there and are not captured). Never freed: a few hundred bytes a stream. A captured graph's
// launches keep the counters of the stream it was captured on: replaying it on another stream while that stream
// runs this kernel too would share them (the engine replays its graphs on their capture stream).
int* arrival_counters(int device, cudaStream_t stream) {
  constexpr int64_t kCounters = paged_plan::kMaxArrivalCounters;
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  const std::lock_guard<std::mutex> lock(mutex);
  int*& slot = counters[{device, stream}];
  if (slot == nullptr) {
    const detail::CudaDeviceGuard guard(device);
    void* p = nullptr;
    MICROLLM_CUDA_CHECK(cudaMalloc(&p, kCounters * sizeof(int)));
    cudaStream_t zeroing = nullptr;
    MICROLLM_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
    MICROLLM_CUDA_CHECK(cudaMemsetAsync(p, 0, kCounters * sizeof(int), zeroing));
    MICROLLM_CUDA_CHECK(cudaStreamSynchronize(zeroing));
    MICROLLM_CUDA_CHECK(cudaStreamDestroy(zeroing));
    slot = static_cast<int*>(p);
  }
  return slot;
}

// The plan's key loop and projection shares into the kernels' arguments.
void apply_plan(PagedArgs& a, const DecodePlan& p) {
  a.row_blocks = p.row_blocks;
  a.chunk = p.chunk;
  a.n_split = p.n_split;
  a.pitch = p.pitch;
  a.stage_bytes = p.stage_bytes;
  a.slices = p.slices;
  a.replicas = p.replicas;
  a.o_cols = p.o_cols;
  a.proj_offset = p.proj_offset;
}

// A staged plan (and split_projected's): the staged kernel of R rows a CTA, then past one split the combine
// (paged_combine_kernel, or in clusters paged_combine_projected_kernel).
template <typename T, int R, bool kFused>
void launch_staged(const DecodePlan& p, PagedArgs a, const RopeFreq& freq, int64_t tokens, Device dev,
                   cudaStream_t stream) {
  const int device = dev.index;
  const dim3 grid(static_cast<unsigned>(p.grid_x), static_cast<unsigned>(p.grid_y));
  if (p.n_split == 1) {
    with_head_dim(a.dim, [&]<int kDim>() {
      raise_smem_limit<paged_staged_kernel<T, R, kDim, true, kFused>>(paged_plan::kMaxStagedSmem, device);
      launch_chained(paged_staged_kernel<T, R, kDim, true, kFused>, grid, p.threads, p.smem, stream, device, a, freq);
    });
    return;
  }
  const int64_t rows = tokens * a.q_heads;
  const Tensor part_o = Tensor::empty({rows * p.n_split * a.dim}, DType::f32, dev);
  const Tensor part_m = Tensor::empty({rows * p.n_split}, DType::f32, dev);
  const Tensor part_l = Tensor::empty({rows * p.n_split}, DType::f32, dev);
  a.part_o = part_o.data<float>();
  a.part_m = part_m.data<float>();
  a.part_l = part_l.data<float>();
  with_head_dim(a.dim, [&]<int kDim>() {
    raise_smem_limit<paged_staged_kernel<T, R, kDim, false, kFused>>(paged_plan::kMaxStagedSmem, device);
    launch_chained(paged_staged_kernel<T, R, kDim, false, kFused>, grid, p.threads, p.smem, stream, device, a, freq);
  });
  const dim3 combine_grid(static_cast<unsigned>(p.combine_grid_x), static_cast<unsigned>(p.combine_grid_y));
  if (p.kernel == DecodeKernel::split_projected) {
    launch_chained_in_clusters(p.cluster, combine_projected_kernel<T>(p.replicas), combine_grid,
                               paged_plan::kSmallThreads, p.combine_smem, stream, device, a);
  } else {
    launch_chained(paged_combine_kernel<T>, combine_grid, paged_plan::kSmallThreads, p.combine_smem, stream, device, a,
                   rows);
  }
}

std::atomic<int64_t> g_projected_launches{0};
std::atomic<int64_t> g_token_cluster_launches{0};
std::atomic<int64_t> g_head_cluster_launches{0};

// The one launch switch: the plan's kernel with its grid (the composition is the caller's).
template <typename T, bool kFused>
void launch_plan(const DecodePlan& p, PagedArgs a, const RopeFreq& freq, int64_t tokens, Device dev,
                 cudaStream_t stream) {
  apply_plan(a, p);
  const int device = dev.index;
  const dim3 grid(static_cast<unsigned>(p.grid_x), static_cast<unsigned>(p.grid_y));
  switch (p.kernel) {
    case DecodeKernel::simple:
      if (p.smem > 48 * 1024) {
        MICROLLM_CUDA_CHECK(cudaFuncSetAttribute(paged_simple_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(p.smem)));
      }
      paged_simple_kernel<T><<<grid, p.threads, p.smem, stream>>>(a);
      MICROLLM_CUDA_CHECK_LAUNCH();
      return;
    case DecodeKernel::staged:
    case DecodeKernel::split_projected:
      if (p.rows_per_cta == 1) {
        launch_staged<T, 1, kFused>(p, a, freq, tokens, dev, stream);
      } else {
        launch_staged<T, kRowsPerCta, kFused>(p, a, freq, tokens, dev, stream);
      }
      break;
    case DecodeKernel::head_clusters: {
      const Tensor partial = Tensor::empty({tokens * a.kv_heads * a.hidden}, DType::f32, dev);
      a.proj_partial = partial.data<float>();
      a.proj_counters = arrival_counters(device, stream);
      launch_chained_in_clusters(p.cluster, cluster_kernel<T>(p, a.dim), grid, p.threads, p.smem, stream, device, a,
                                 freq);
      g_head_cluster_launches.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    case DecodeKernel::token_cluster:
      g_token_cluster_launches.fetch_add(1, std::memory_order_relaxed);
      [[fallthrough]];
    case DecodeKernel::projected:
      launch_chained_in_clusters(p.cluster, cluster_kernel<T>(p, a.dim), grid, p.threads, p.smem, stream, device, a,
                                 freq);
      break;
    case DecodeKernel::composition:
      return;
  }
  if (p.kernel != DecodeKernel::staged) g_projected_launches.fetch_add(1, std::memory_order_relaxed);
}

// `bench --explain`'s record: the op, its shapes and the plan's line (when recording is on), and where the step's
// QK-norm runs (`qk_norm`: "" for none).
void record_plan(const char* op, const paged_plan::DecodeShape& s, const DecodePlan& p, const char* qk_norm = "") {
  if (!recording_kernel_choices()) return;
  std::string shape = "tokens " + std::to_string(s.tokens) + ", heads " + std::to_string(s.q_heads) + "/" +
                      std::to_string(s.kv_heads) + " x " + std::to_string(s.dim) + ", context " +
                      std::to_string(s.max_context);
  if (s.window > 0) shape += ", window " + std::to_string(s.window);
  if (s.hidden > 0) shape += ", o " + std::to_string(s.hidden) + "x" + std::to_string(s.o_in);
  record_kernel_choice(op, shape, p.describe() + qk_norm);
}

// The arguments every attention kernel reads.
PagedArgs attention_args(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_tables,
                         const Tensor& seq_ids, const Tensor& positions, double scale, int64_t max_context,
                         int64_t window, const Tensor& out, uint64_t* error_word) {
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
  a.window = static_cast<int>(std::min<int64_t>(window, INT32_MAX));
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

// Whether the fused kernels normalize q and k as they load them (PagedArgs' QK-norm weights): where qk_rms_norm's
// warp rows would (heads of at most 32 16-byte packs; the kernels take f32, f16 and bf16 only), with unit-stride,
// 16-byte aligned weights.
bool folds_qk_norm(const QkNormParams& norm, const Tensor& q) {
  return norm.defined() && q.size(2) * static_cast<int64_t>(dtype_size(q.dtype())) <= 32 * 16 &&
         norm.q_weight.stride(0) == 1 && norm.k_weight.stride(0) == 1 && rows::aligned16(norm.q_weight.data_ptr()) &&
         rows::aligned16(norm.k_weight.data_ptr());
}

// The q and k a fused kernel reads: as given where it folds the QK-norm (or there is none), else normalized first by
// `fusions`' qk_rms_norm.
std::pair<Tensor, Tensor> kernel_qk(Fusions& fusions, const Tensor& q, const Tensor& k, const QkNormParams& norm) {
  if (!norm.defined() || folds_qk_norm(norm, q)) return {q, k};
  return fusions.normalized_qk(q, k, norm);
}

// record_plan's note on a fused step's QK-norm.
const char* qk_norm_note(const QkNormParams& norm, const Tensor& q, const DecodePlan& p) {
  if (!norm.defined()) return "";
  return folds_qk_norm(norm, q) && p.kernel != DecodeKernel::composition ? "; QK-norm in its loads"
                                                                          : "; qk_rms_norm first";
}

void set_qk_norm(PagedArgs& a, const QkNormParams& norm, const Tensor& q) {
  if (!folds_qk_norm(norm, q)) return;
  a.q_norm_weight = norm.q_weight.data_ptr();
  a.k_norm_weight = norm.k_weight.data_ptr();
  a.norm_eps = static_cast<float>(norm.eps);
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
                                  double scale, int64_t max_context, const Tensor& out, int64_t window) {
  OpScope scope("paged_attention", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  namespace pg = paged;
  pg::PagedArgs a = pg::attention_args(q, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context, window,
                                       out, detail::cuda_error_word(device_));
  visit_float(q.dtype(), "paged_attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      no_kernel("paged_attention", DType::f64);  // the op allows f32/f16/bf16 pools only
    } else {
      const auto shape = pg::decode_shape<T>(q, k_pool, v_pool, max_context, window);
      const auto plan = paged_plan::plan_attention(shape, pg::device_limits(launch.device));
      pg::record_plan("paged_attention", shape, plan);
      pg::launch_plan<T, false>(plan, a, pg::RopeFreq{}, q.size(0), out.device(), launch.stream);
    }
  });
}

void CudaFusions::paged_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                         const Tensor& k_pool, const Tensor& v_pool, const Tensor& slots,
                                         const Tensor& block_tables, const Tensor& seq_ids, const Tensor& positions,
                                         double scale, int64_t max_context, const Tensor& out, int64_t window,
                                         const QkNormParams& qk_norm) {
  namespace pg = paged;
  paged_plan::DecodePlan plan;
  paged_plan::DecodeShape shape;
  visit_float(q.dtype(), "paged_decode_attention", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      shape = pg::decode_shape<T>(q, k_pool, v_pool, max_context, window);
      plan = paged_plan::plan_attention(shape, pg::device_limits(device_), paged_plan::DecodeKernel::composition);
    }
  });
  pg::record_plan("paged_decode_attention", shape, plan, pg::qk_norm_note(qk_norm, q, plan));
  if (plan.kernel == paged_plan::DecodeKernel::composition) {  // the separate ops, one after the other
    Fusions::paged_decode_attention(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions, scale,
                                    max_context, out, window, qk_norm);
    return;
  }
  OpScope scope("paged_decode_attention", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  const auto [q_in, k_in] = pg::kernel_qk(*this, q, k, qk_norm);
  pg::PagedArgs a = pg::attention_args(q_in, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context,
                                       window, out, detail::cuda_error_word(device_));
  pg::set_new_kv(a, k_in, v, slots, rope, q.size(2));
  pg::set_qk_norm(a, qk_norm, q);
  const pg::RopeFreq freq = rotary::inv_freq_arg<float, pg::kMaxFastDim / 2>(rope, q.size(2));
  visit_float(q.dtype(), "paged_decode_attention", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>)
      pg::launch_plan<T, true>(plan, a, freq, q.size(0), out.device(), launch.stream);
  });
}

// One kernel where the plan finds one for the shapes (16-bit weights in 16-byte aligned rows; paged_decode_plan.h);
// otherwise the composition: paged_decode_attention, then the decode GEMV or cuBLASLt with the addend.
void CudaFusions::paged_decode_attention_projected(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const RopeParams& rope, const Tensor& k_pool, const Tensor& v_pool,
                                                   const Tensor& slots, const Tensor& block_tables,
                                                   const Tensor& seq_ids, const Tensor& positions, double scale,
                                                   int64_t max_context, const Tensor& o_weight, const Tensor& addend,
                                                   const Tensor& out, int64_t window, const QkNormParams& qk_norm) {
  namespace pg = paged;
  paged_plan::DecodePlan plan;
  auto with_16_bit = [&](auto&& f) {
    if (q.dtype() == DType::bf16) f.template operator()<__nv_bfloat16>();
    if (q.dtype() == DType::f16) f.template operator()<__half>();
  };
  with_16_bit([&]<typename T>() {
    const detail::CudaDeviceGuard guard(device_);  // the cluster-fit query sets the kernels' attributes
    const auto shape = pg::decode_shape<T>(q, k_pool, v_pool, max_context, window, o_weight);
    plan = paged_plan::plan_attention_projected(shape, pg::device_limits(device_), pg::decode_policy(),
                                                pg::clusters_fit_on<T>(device_, shape.dim));
    pg::record_plan("paged_decode_attention_projected", shape, plan, pg::qk_norm_note(qk_norm, q, plan));
  });
  if (plan.kernel == paged_plan::DecodeKernel::composition) {
    Fusions::paged_decode_attention_projected(q, k, v, rope, k_pool, v_pool, slots, block_tables, seq_ids, positions,
                                              scale, max_context, o_weight, addend, out, window, qk_norm);
    return;
  }
  const OpScope scope("paged_decode_attention_projected", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  const auto [q_in, k_in] = pg::kernel_qk(*this, q, k, qk_norm);
  pg::PagedArgs a = pg::attention_args(q_in, k_pool, v_pool, block_tables, seq_ids, positions, scale, max_context,
                                       window, out, detail::cuda_error_word(device_));
  pg::set_new_kv(a, k_in, v, slots, rope, q.size(2));
  pg::set_qk_norm(a, qk_norm, q);
  a.out = nullptr;  // the attention's output stays in shared memory
  a.o_weight = o_weight.data_ptr();
  a.o_weight_stride = o_weight.stride(0);
  a.addend = addend.defined() ? addend.data_ptr() : nullptr;
  a.proj_out = out.data_ptr();
  a.hidden = static_cast<int>(o_weight.size(0));
  a.o_in = static_cast<int>(o_weight.size(1));
  const pg::RopeFreq freq = rotary::inv_freq_arg<float, pg::kMaxFastDim / 2>(rope, q.size(2));
  with_16_bit([&]<typename T>() { pg::launch_plan<T, true>(plan, a, freq, q.size(0), out.device(), launch.stream); });
}

}  // namespace microllm
