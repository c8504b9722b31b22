// Device pieces of paged_decode_attention_projected's last phase (paged_attention.cu: kProject, the token's
// cluster kernel, and past one split the combine kernel's projected form): the cluster's exchange of the query
// heads' outputs and the o projection of a CTA's share of the columns. A cluster of C CTAs holds one token's query
// heads, CTA rank h head h (C >= q_heads: ranks past the heads hold none); a token has `replicas` clusters (grid y),
// so CTA (h, replica r) owns output columns [(r * C + h) * o_cols, +o_cols). The cluster pieces are sm_90 (a HIP port
// compiles the projected kernels out and runs the composition, docs/CUDA.md).
#pragma once

#include <cooperative_groups.h>

#include "common.cuh"
#include "decode_phases.cuh"

namespace microllm::cuda_kernels::paged {

// The first of this CTA's o_cols output columns, for clusters of cluster_ctas CTAs (grid x: token x rank, grid y:
// replica); past hidden for the last CTAs where the columns do not divide.
__device__ __forceinline__ int projected_col0(int cluster_ctas, int o_cols) {
  return (static_cast<int>(blockIdx.y) * cluster_ctas + static_cast<int>(blockIdx.x) % cluster_ctas) * o_cols;
}
__device__ __forceinline__ int projected_cols(int cluster_ctas, int o_cols, int hidden) {
  return max(0, min(o_cols, hidden - projected_col0(cluster_ctas, o_cols)));
}

// The thread-block cluster's barrier in its two halves (sm_90): arrive publishes the thread's shared-memory writes
// to the cluster (release) without waiting, wait returns once every thread of the cluster has arrived (acquire),
// so work placed between the two overlaps the other CTAs' arrival.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// Between a cluster barrier's wait and its next arrive: x [o_in] = every CTA's head [dim] in rank order, read
// from the CTAs' shared memory (distributed shared memory), 16 bytes a thread at a time; kThreads = blockDim.x.
template <int kThreads, typename T>
__device__ void gather_heads(const T* head, T* x, int o_in, int dim) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  for (int p = static_cast<int>(threadIdx.x); p < o_in / 8; p += kThreads) {
    const T* src = cluster.map_shared_rank(head, p * 8 / dim) + (p * 8) % dim;
    *reinterpret_cast<uint4*>(x + p * 8) = *reinterpret_cast<const uint4*>(src);
  }
}

// Starts an L2 fill of `bytes` (a multiple of 16) at the 16-byte aligned `p`, without waiting for it and
// without an SM's loads in flight (sm_90's bulk prefetch; elsewhere nothing).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8]) {
  const T* e = reinterpret_cast<const T*>(&w);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s += to_acc(e[i]) * x[i];
  return s;
}

// store(j, x . w_j) for the CTA's `cols` rows w_j = w + j * w_stride of o_in elements (kRowsStaged: in shared
// memory; else global memory that the kernel's start put in L2), x [o_in] in shared memory. Warp w of kWarps
// (blockDim.x / 32) owns rows w, w + kWarps, ..., kRows at a time with two 16-byte loads each in flight per lane,
// f32 sums reduced across the warp; lane i stores the warp's i-th row, so what store adds for row j (the addend:
// rounded_store) is lane i's, loaded while the attention ran. kRows: from L2, 8 rows' loads in flight hide its
// latency; from shared memory 4 rows, so that their warp reductions overlap (a row at a time, each row's five
// dependent shuffles are the warp's critical path; docs/perf/kernels.md#paged-attention). A row's sum is the same
// whatever kRows is.
template <bool kRowsStaged, int kWarps, typename T, typename Store>
__device__ void project_rows(const T* x, const T* w, int64_t w_stride, int cols, int o_in, Store store) {
  constexpr int kRows = kRowsStaged ? 4 : 8;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int packs = o_in / 8;
  for (int i0 = 0; warp + i0 * kWarps < cols; i0 += kRows) {
    float acc[kRows] = {};
    for (int p = lane; p < packs; p += 64) {
      const bool second = p + 32 < packs;
      uint4 wv[kRows][2];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int j = warp + (i0 + r) * kWarps;
        const uint4* row = reinterpret_cast<const uint4*>(w + (j < cols ? j : 0) * w_stride);
        wv[r][0] = j < cols ? row[p] : make_uint4(0, 0, 0, 0);
        wv[r][1] = j < cols && second ? row[p + 32] : make_uint4(0, 0, 0, 0);
      }
      float x0[8], x1[8];
      load8(x + p * 8, x0);
      if (second) {
        load8(x + (p + 32) * 8, x1);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x1[e] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] += dot8<T>(wv[r][0], x0) + dot8<T>(wv[r][1], x1);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = warp_sum(acc[r]);
      const int i = i0 + r, j = warp + i * kWarps;
      if (lane == i && j < cols) store(j, sum);
    }
  }
}

// project_rows' store for a whole product: out[j] = round(first_addend + sum), the addend of row j (or 0) held by
// the lane that stores row j (linear_add's one rounding).
template <typename T>
__device__ __forceinline__ auto rounded_store(T* out, float first_addend) {
  return [=](int j, float sum) { out[j] = from_acc<T>(sum + first_addend); };
}

// The warp-lane mapping of project_rows' stores: thread tid stores row tid / 32 + (tid % 32) * kWarps, the row
// whose addend it loads before the attention (first_addend).
template <int kWarps>
__device__ __forceinline__ int stored_row() {
  return static_cast<int>(threadIdx.x) / 32 + static_cast<int>(threadIdx.x) % 32 * kWarps;
}

// Once every CTA of the cluster with a query head (rank h: head h) has its head's output in `head` [dim]: the
// exchange of the heads into x [o_in] and the CTA's share of the columns (project_rows), the addend added before
// the one rounding. kRowsStaged: rows w are in shared memory (w_stride = o_in), copied with cp.async before the
// kernel's wait, each thread waiting for its own copies here; else streamed through L2 (a fill started before the
// wait). Every thread of every CTA of the cluster calls it.
template <int kThreads, bool kRowsStaged, typename T, typename Store>
__device__ void exchange_and_project(const T* head, T* x, int o_in, int dim, const T* w, int64_t w_stride, int cols,
                                     Store store) {
  cluster_arrive();
  cluster_wait();  // every CTA of the token has its head
  gather_heads<kThreads>(head, x, o_in, dim);
  cluster_arrive();  // done reading the others' heads; they may exit once all have arrived
  if constexpr (kRowsStaged) copy_async_wait_all();  // the barrier below shows every thread's rows to all
  __syncthreads();
  project_rows<kRowsStaged, kThreads / 32>(x, w, w_stride, cols, o_in, store);
  cluster_wait();  // no CTA leaves while another may still read its shared memory
}

// Head clusters (paged_token_cluster_kernel's kHeadClusters): kv_heads clusters each left their part of the CTA's
// `cols` columns in partial [kv_heads][hidden] (from the column block's first column, f32, kv head h's at
// h * hidden). Each CTA counts itself on its column block's counter; the last of the kv_heads to arrive writes
// out[j] = round(first_addend + sum over h in order of partial[h][j]) (the sum's order is fixed, so the bits do not
// depend on which arrives last) and puts the counter back to zero for the next launch. Nobody waits: a cluster
// that arrives early just exits. Every thread of the CTA calls it, after its stores to partial.
template <int kWarps, typename T>
__device__ void merge_partial_columns(const float* partial, int hidden, int kv_heads, int cols, int* counter,
                                      float first_addend, T* out) {
  __threadfence();  // this thread's partial sums reach every SM before the CTA's arrival is counted
  __syncthreads();
  // (A barrier that also hands thread 0's answer to all: no static shared memory, which would lower the kernel's
  // dynamic limit below the opt-in that the launch code assumes.)
  const bool last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(counter, 1) == kv_heads - 1);
  if (!last) return;
  __threadfence();                     // the other clusters' sums, counted before this arrival, are read after it
  const int j = stored_row<kWarps>();  // the row whose addend this thread holds
  if (j < cols) {
    float sum = 0.f;
    for (int h = 0; h < kv_heads; ++h) sum += __ldcg(partial + static_cast<int64_t>(h) * hidden + j);  // not L1
    out[j] = from_acc<T>(sum + first_addend);
  }
  if (threadIdx.x == 0) *counter = 0;
}

// Past one split (a long context) the projection follows the combine instead: clusters of a token's query heads,
// CTA rank h merging head h's splits into `head` [dim] (combine_row: the combine kernel's arithmetic and rounding
// when kThreads is its block size), then exchange_and_project. w_scratch: the merge's [used] weights and 32 floats
// of reduction scratch.
template <int kThreads, bool kRowsStaged, typename T>
__device__ void combine_and_project(const float* m, const float* l, const float* part_o, int used, int dim,
                                    float* w_scratch, int n_split, T* head, T* x, int o_in, const T* w,
                                    int64_t w_stride, int cols, float first_addend, T* out) {
  decode_phases::combine_row(m, l, part_o, used, dim, w_scratch, w_scratch + n_split, head);  // ends with a barrier
  exchange_and_project<kThreads, kRowsStaged>(head, x, o_in, dim, w, w_stride, cols, rounded_store(out, first_addend));
}

}  // namespace microllm::cuda_kernels::paged
