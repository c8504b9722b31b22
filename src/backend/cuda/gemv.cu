// The decode GEMV: out [m, n] = x [m, k] @ w [n, k]^T (+ bias) for m <= 8 rows, bf16/f16, f32 accumulation,
// with two steps of a decoder layer optionally folded in (m <= 2):
//   RMSNorm before: x is first h = round(x + residual) (or x), then round(g * round(h * rstd)) (rms_norm's
//     roundings), computed by every CTA into shared memory; CTA 0 also writes h (the residual stream). A sandwich
//     block's sublayer output gets its own RMSNorm first (x_norm_weight), with the same roundings, before the add.
//   The gate after: w is [w_gate; w_up] (2n rows) and out[b, j] = silu(round(gate)) * round(up), rounded once
//     (swiglu's arithmetic on the rounded gate_up product), or round(round(gelu_tanh(round(gate))) * round(up))
//     (geglu: Fusions::geglu's, the gelu and mul ops').
// A batch-1 decode layer is then five kernels (qkv with input_layernorm, attention, o, gate_up with
// post_attention_layernorm and SwiGLU, down) instead of eight; a Gemma 3 layer folds its two sandwich norms
// and GeGLU the same way.
//
// Why a GEMV: at decode a linear layer reads each weight once and does 2m flops per weight, so its time is the
// weight bytes over DRAM bandwidth, and cuBLASLt's choices for the small shapes leave much of it unused
// (docs/perf/kernels.md#gemv has the measurements behind this comment's rules and constants).
//
// 1. Streams: each lane keeps kRingSlots (16) 16-byte weight chunks in flight through a ring of its own in
//    shared memory, filled with cp.async (L1 bypassed: read once; L2::256B prefetch) and refilled as each chunk
//    is consumed, so no register is held by a load in flight. The thread's copy groups are counted:
//    one per chunk, so waiting for all but the newest 15 means the chunk about to be read has landed.
// 2. Multiplies on the tensor cores: one warp owns a group of 8 weight rows and computes the 16x8 tile
//    D = A B of mma.m16n8k16 with A = x (rows: the m <= 8 batch rows, rows 8..15 zero) and B = w^T (columns:
//    the 8 weight rows). The order of k inside a dot product is free, so lane (g, t) = (lane / 4, lane % 4)
//    loads 8 consecutive elements of weight row g and the same 8 elements of x row g, at k = 32c + 8t of
//    chunk c: registers 0-1 of each become the k-pairs (2t, 2t+8) of one mma, registers 2-3 of a second.
//    Two mma per 16-byte weight load whatever m is, and one 16-byte x load from shared memory: every CTA
//    stages x there right after its wait, all of a thread's loads in flight at once (copy_packs), so that no
//    chunk's mma waits for its own L2 round trip to x (the kernel before's output). At 8 rows x is read from
//    global memory still (kMaxStagedPlainRows).
//    With a gate, two warps of a CTA stream the 8 gate rows and the 8 matching up rows of one output group.
// 3. Fills the GPU: the warps of a CTA split k (split = 1..16 warps per row group, partial tiles summed
//    in shared memory in slice order: deterministic). The host picks split from n, k and the SM count
//    (the launch shape depends only on shapes, so graphs replay it): the smallest power of two that gives
//    kWarpsTarget (8) warps per SM, but no more slices than k has runs of 8 chunks. At 8 the folded gate_up
//    streams whole rows per warp (split 1: half the CTAs, each normalizing x once) and its CTAs leave room on
//    each SM for the down projection's CTAs to start early (chained launches), while down keeps split 16.
// 4. Rounds once: out = round(acc + bias (+ addend)) in f32, like cuBLASLt's epilogue (bias; beta = 1).
// 5. Launches chained (common.cuh) in decode graphs: the ring's first chunks (and the norm weight) stream in
//    before the kernel waits for the one before it.
//
// Where it runs: a plain product up to kMaxPlainBytes (16 MB: qkv, o and Qwen2.5-0.5B's down; past it cuBLASLt's
// tiles stream faster). Folded, up to kMaxFoldedBytes (32 MB) and kMaxFoldedRows (2): the two kernels the fold
// saves pay for its slower stream up to there; at m = 8 each of gate_up's CTAs would normalize all 8 rows.
// MICROLLM_DISABLE=gemv (decode_gemv()) sends these products back to cuBLASLt (and the folded steps to their own
// kernels), to A/B the two in one run.
#include <climits>
#include <string>
#include <optional>

#include "../elementwise_math.h"
#include "attention_mma.cuh"
#include "common.cuh"
#include "cuda_backend.h"
#include "gemv.h"
#include "microllm/backend/backend.h"
#include "microllm/backend/kernel_choices.h"
#include "op_scope.h"
#include "rows.cuh"

namespace microllm::cuda_kernels {
namespace {

constexpr int kGemvMaxRows = 8;    // x rows: the 8 live rows of the mma's A (m16, rows 8..15 stay zero)
constexpr int kGroupRows = 8;      // weight rows per warp: the mma's n
constexpr int kChunk = 32;         // k per 16-byte load of every lane: 4 lanes x 8 elements per weight row
constexpr int kMaxSplit = 16;      // warps per row group
constexpr int kMaxThreads = 32 * kMaxSplit;
constexpr int kMaxStaged = 64 * 1024;  // dynamic shared memory for the staged x and the norm weights

constexpr int kRingSlots = 16;         // 16-byte weight chunks each lane keeps in flight, in shared memory
constexpr int kRingBytesPerThread = kRingSlots * 16;
constexpr int kMinChunksPerWarp = 8;   // the split leaves every warp at least this many chunks of its row
constexpr int kWarpsTarget = 8;        // warps per SM the split aims for (the header comment, point 3)
// Where the GEMV runs (the header comment, "Where it runs"):
constexpr int64_t kMaxPlainBytes = 16 << 20;   // a plain product: past it cuBLASLt streams faster
constexpr int64_t kMaxFoldedBytes = 32 << 20;  // with the RMSNorm / gate folded in: the two kernels it saves
                                               // pay for a slower stream, up to a point
// A plain product stages x in shared memory up to this many rows (the header comment, point 2): at 8 rows x's loads
// hit L1, and the staging would hold every mma back until all 8 rows have landed.
constexpr int64_t kMaxStagedPlainRows = 2;
constexpr int64_t kMaxFoldedRows = 2;          // every CTA normalizes all m rows of x: past 2 rows it lost

struct GemvArgs {
  const void* x;
  int64_t x_stride;
  const void* w;
  int64_t w_stride;
  const void* bias;  // may be null
  int64_t bias_stride;
  void* out;           // [m, n] contiguous
  const void* addend;  // [m, n] contiguous, may be null: added to the product before its one rounding
  int m, n, k;
  int chunks_per_warp;  // of the launch's split (the kernel's kSplit)
  // RMSNorm folded in (kNorm): h = x' + residual (residual may be null), normalized with norm_weight [k]; x' = x, or
  // x normalized with x_norm_weight [k] where that is not null.
  const void* residual;
  int64_t residual_stride;
  const void* norm_weight;
  const void* x_norm_weight;
  float eps;
  void* h_out;  // [m, k] contiguous, may be null: CTA 0 writes h there
  int x_pitch;  // elements per staged x row: k plus 16 bytes, so the 8 rows' loads spread over the banks; 0: x is
                // not staged (a plain product past kMaxStagedPlainRows or kMaxStaged reads it from global memory)
  // A gate folded in (kGate): the up row of output column j is weight row up_row0 + j.
  int64_t up_row0;
};

// kNorm, before the wait: the norm weights (no kernel writes them) to shared memory, sg [k] and sgx [k], cp.async,
// as the thread's first copy group (older than its ring's, so a wait for its ring's first chunk covers it).
template <int kThreads, typename T>
__device__ void stage_norm_weights(const GemvArgs& a, T* sg, T* sgx) {
  for (int p = static_cast<int>(threadIdx.x); p < a.k / 8; p += kThreads) {
    copy16_async(sg + p * 8, static_cast<const T*>(a.norm_weight) + p * 8);
    if (a.x_norm_weight) copy16_async(sgx + p * 8, static_cast<const T*>(a.x_norm_weight) + p * 8);
  }
  copy_async_commit();
}

// After the wait: `packs` 16-byte packs from global memory (src(i)) to shared memory (dst(i)), plain loads (a
// cp.async would queue behind the ring's weight copies), kBatch of a thread's loads issued before any of its stores.
// Why batched: the compiler must assume a store to shared memory may alias the next generic load, so a loop of
// load-then-store waits one L2 round trip a pack.
template <int kThreads, typename Src, typename Dst>
__device__ __forceinline__ void copy_packs(int packs, Src src, Dst dst) {
  constexpr int kBatch = 4;
  for (int i0 = static_cast<int>(threadIdx.x); i0 < packs; i0 += kThreads * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (i0 + u * kThreads < packs) v[u] = *reinterpret_cast<const uint4*>(src(i0 + u * kThreads));
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (i0 + u * kThreads < packs) *reinterpret_cast<uint4*>(dst(i0 + u * kThreads)) = v[u];
    }
  }
}

// The m rows of x, [m][x_pitch] in shared memory (the plain product's staged x). Needs k % 8 == 0 and 16-byte
// aligned rows (the host checks).
template <int kThreads, typename T>
__device__ __forceinline__ void stage_x(const GemvArgs& a, T* sx) {
  const int packs = a.k / 8;
  copy_packs<kThreads>(
      a.m * packs, [&](int i) { return static_cast<const T*>(a.x) + i / packs * a.x_stride + i % packs * 8; },
      [&](int i) { return sx + i / packs * a.x_pitch + i % packs * 8; });
}

// f(r, u, p) for the packs p = p0 + u * kThreads (u < kBatch) of rows r < m that lie within `packs`, unrolled:
// one batch of stage_normalized_x, whose loads all run before any of its stores (two calls).
template <int kThreads, int kRows, int kBatch, typename F>
__device__ __forceinline__ void for_batch_packs(int p0, int m, int packs, F&& f) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int p = p0 + u * kThreads;
      if (r >= m || p >= packs) continue;
      f(r, u, p);
    }
  }
}

// kNorm: each row's 1 / rms from every thread's partial sums of squares over its packs, added across its warp, then
// over the warps in order through scratch [warps][kMaxFoldedRows]: the same order whatever m is, so a row normalized
// beside another gets the bits it gets alone. Also waits for the norm weights' copy group (every group but the
// ring's kRingSlots). Has a barrier (every thread of the CTA calls it); scratch is free again after the next one.
template <int kThreads>
__device__ void rows_rstd(const GemvArgs& a, const float (&sum_sq)[kMaxFoldedRows], float* scratch,
                          float (&rstd)[kMaxFoldedRows]) {
  constexpr int kRows = kMaxFoldedRows, kWarps = kThreads / 32;
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float warp_total = warp_sum(sum_sq[r]);
    if (tid % 32 == 0) scratch[tid / 32 * kRows + r] = warp_total;
  }
  copy_async_wait_group<kRingSlots>();
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += scratch[w * kRows + r];
    rstd[r] = 1.0f / sqrtf(total / static_cast<float>(a.k) + a.eps);
  }
}

// Rows [m][x_pitch] of shared memory normalized in place: round(g * round(h * rstd)) with g [k] (rms_norm's
// roundings). Each thread rewrites only the packs it staged (tid, tid + kThreads, ...): no barrier before.
template <int kThreads, typename T>
__device__ void normalize_staged_rows(const GemvArgs& a, T* rows, const T* g_weight,
                                      const float (&rstd)[kMaxFoldedRows]) {
  for (int p = static_cast<int>(threadIdx.x); p < a.k / 8; p += kThreads) {
    float g[8];
    load8(g_weight + p * 8, g);
#pragma unroll
    for (int r = 0; r < kMaxFoldedRows; ++r) {
      if (r >= a.m) continue;
      T* hs = rows + r * a.x_pitch + p * 8;
      float h[8];
      load8(hs, h);
      alignas(16) T packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = from_acc<T>(g[e] * to_acc(from_acc<T>(h[e] * rstd[r])));
      *reinterpret_cast<uint4*>(hs) = *reinterpret_cast<const uint4*>(packed);
    }
  }
}

// kNorm with x_norm_weight, after the wait: sx [m][x_pitch] = rms_norm(x) * sgx, a sandwich block's sublayer output
// normalized before its residual add; stage_normalized_x then reads x' from there. x is staged as a plain product
// stages it, then every thread sums and normalizes the packs tid, tid + kThreads, ... of each row (the order
// stage_normalized_x sums in, so a row's bits do not depend on m).
template <int kThreads, typename T>
__device__ void stage_x_own_norm(const GemvArgs& a, T* sx, const T* sgx, float* scratch) {
  stage_x<kThreads>(a, sx);
  __syncthreads();  // stage_x's packs are other threads' than the ones summed below
  float sum_sq[kMaxFoldedRows] = {};
  for (int p = static_cast<int>(threadIdx.x); p < a.k / 8; p += kThreads) {
#pragma unroll
    for (int r = 0; r < kMaxFoldedRows; ++r) {
      if (r >= a.m) continue;
      float v[8];
      load8(sx + r * a.x_pitch + p * 8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq[r] += v[e] * v[e];
    }
  }
  float rstd[kMaxFoldedRows];
  rows_rstd<kThreads>(a, sum_sq, scratch, rstd);
  normalize_staged_rows<kThreads>(a, sx, sgx, rstd);
  __syncthreads();  // scratch free for stage_normalized_x's sums
}

// kNorm, after the wait: every CTA normalizes the m rows of x' (x, or sx as stage_x_own_norm left it) plus the
// residual (h = round(x' + residual) with one) into sx [m][x_pitch] with rms_norm's roundings (norm.cu); CTA 0 also
// writes h. Every thread works: thread tid owns packs tid, tid + kThreads, ... of every row (a warp a row left most
// of the CTA idle, one warp stepping through a whole row twice), holding x' and the residual in registers from its
// loads to h, kBatch packs' loads a row issued before any store (copy_packs says why); rows_rstd sums the squares.
// The norm weight sg [k] came by cp.async before the wait. Needs k % 8 == 0, m <= kMaxFoldedRows and 16-byte
// aligned rows (the host checks).
template <int kThreads, typename T>
__device__ void stage_normalized_x(const GemvArgs& a, T* sx, const T* sg, float* scratch) {
  constexpr int kRows = kMaxFoldedRows, kBatch = 2;
  const int tid = static_cast<int>(threadIdx.x), packs = a.k / 8;
  const bool own_norm = a.x_norm_weight != nullptr;  // x' is in sx already
  const T* x = own_norm ? sx : static_cast<const T*>(a.x);
  const int64_t x_stride = own_norm ? a.x_pitch : a.x_stride;
  const T* res = static_cast<const T*>(a.residual);
  T* h_out = blockIdx.x == 0 ? static_cast<T*>(a.h_out) : nullptr;
  float sum_sq[kRows] = {};
  for (int p0 = tid; p0 < packs; p0 += kThreads * kBatch) {
    uint4 xv[kRows][kBatch], rv[kRows][kBatch];
    for_batch_packs<kThreads, kRows, kBatch>(p0, a.m, packs, [&](int r, int u, int p) {
      xv[r][u] = *reinterpret_cast<const uint4*>(x + r * x_stride + p * 8);
      if (res) rv[r][u] = *reinterpret_cast<const uint4*>(res + r * a.residual_stride + p * 8);
    });
    for_batch_packs<kThreads, kRows, kBatch>(p0, a.m, packs, [&](int r, int u, int p) {
      float h[8];
      load8(reinterpret_cast<const T*>(&xv[r][u]), h);
      if (res) {
        float rr[8];
        load8(reinterpret_cast<const T*>(&rv[r][u]), rr);
#pragma unroll
        for (int e = 0; e < 8; ++e) h[e] = to_acc(from_acc<T>(h[e] + rr[e]));
      }
      alignas(16) T packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sum_sq[r] += h[e] * h[e];
        packed[e] = from_acc<T>(h[e]);
      }
      *reinterpret_cast<uint4*>(sx + r * a.x_pitch + p * 8) = *reinterpret_cast<const uint4*>(packed);
      if (h_out) {
        *reinterpret_cast<uint4*>(h_out + static_cast<int64_t>(r) * a.k + p * 8) =
            *reinterpret_cast<const uint4*>(packed);
      }
    });
  }
  float rstd[kRows];
  rows_rstd<kThreads>(a, sum_sq, scratch, rstd);
  normalize_staged_rows<kThreads>(a, sx, sg, rstd);
  __syncthreads();
}

// Grid: each CTA holds blockDim / 32 / split weight groups of 8 rows; warp w works on weight group w / split,
// k slice w % split (chunks [slice * chunks_per_warp, +chunks_per_warp) of ceil(k / 32)). Without a gate
// weight group i of the CTA is output group i; with it, weight groups 2i and 2i + 1 are the gate and the up
// rows of output group i (one weight stream, one ring, per warp either way).
// kSplit: the launch's split (plan_launch), compiled in with the block size it implies, so the index
// arithmetic after the wait folds to constants.
template <typename T, bool kNorm, GatedActivation kGate, int kSplit>
__global__ void __launch_bounds__(kMaxThreads) decode_gemv_kernel(const GemvArgs a) {
  constexpr bool kGated = kGate != GatedActivation::none;
  constexpr int kStreams = kGated ? 2 : 1;
  constexpr int kThreads = 32 * (kSplit * kStreams > 4 ? kSplit * kStreams : 4);  // blockDim.x
  constexpr int kTile = kGemvMaxRows * kGroupRows;
  // The warps' partial tiles for the epilogue; with kNorm first the RMSNorm's per-warp sums (stage_normalized_x).
  __shared__ float partial[kMaxThreads / 32][kTile];
  static_assert(kTile >= kMaxFoldedRows, "partial holds stage_normalized_x's sums");
  // Every thread's weight ring [warps][kRingSlots][32 lanes] of 16 bytes; then, with kNorm, the normalized x rows
  // [m][x_pitch], the norm weight [k] and x's own norm weight [k] (where there is one).
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int weight_groups = kThreads / 32 / kSplit;
  const int out_groups = weight_groups / kStreams;
  const int64_t group0 = static_cast<int64_t>(blockIdx.x) * out_groups;  // the CTA's first output group
  const int stream = (warp / kSplit) % kStreams;                         // 0: plain / gate rows, 1: up rows
  const int64_t row0 = (group0 + warp / kSplit / kStreams) * kGroupRows;  // output column of this warp's row 0
  const int chunks = (a.k + kChunk - 1) / kChunk;
  const int c_begin = (warp % kSplit) * a.chunks_per_warp;
  const int c_end = min(chunks, c_begin + a.chunks_per_warp);
  const bool live = row0 < a.n;  // warp-uniform: the last CTA may hold groups past n

  // Rows past n (the last group) read row n - 1 again (L2 hits) and are never stored.
  const int64_t row = (row0 + g < a.n ? row0 + g : a.n - 1) + (stream == 1 ? a.up_row0 : 0);
  const T* w_lane = static_cast<const T*>(a.w) + row * a.w_stride + t * 8;
  // The lane's ring of kRingSlots chunks: chunk c in slot (c - c_begin) % kRingSlots, at ring[slot * 32].
  uint4* ring = reinterpret_cast<uint4*>(gemv_smem) + warp * kRingSlots * 32 + lane;
  // k % 8 == 0, so a lane's 8 elements of a chunk lie wholly inside or wholly past k.
  auto chunk_live = [&](int c) { return live && c < c_end && c * kChunk + t * 8 < a.k; };
  auto slot = [&](int c) { return ring + static_cast<unsigned>(c - c_begin) % kRingSlots * 32; };  // c >= c_begin
  auto fetch = [&](int c) {  // one copy group per chunk, empty past the slice: the waits below count groups
    if (chunk_live(c)) copy16_async</*kPrefetch256=*/true>(slot(c), w_lane + c * kChunk);  // read once
    copy_async_commit();
  };
  T* sx = reinterpret_cast<T*>(gemv_smem + kThreads * kRingBytesPerThread);
  T* sg = sx + a.m * a.x_pitch;
  T* sgx = sg + a.k;
  // The weights are no kernel's output: the norm weight and the ring's first kRingSlots chunks stream in while
  // the kernel before (chained launch, common.cuh) still finishes; x, the residual, the bias and out wait for it.
  if constexpr (kNorm) stage_norm_weights<kThreads>(a, sg, sgx);
  for (int j = 0; j < kRingSlots; ++j) fetch(c_begin + j);
  // This thread's first output element (the epilogue's e = threadIdx.x): its bias (a weight) now, its addend
  // right after the wait, so that neither L2 round trip lengthens the epilogue.
  const int first_e = static_cast<int>(threadIdx.x), first_b = first_e % kTile / kGroupRows;
  const int64_t first_col = (group0 + first_e / kTile) * kGroupRows + first_e % kGroupRows;
  const bool first_live = !kGated && first_e < out_groups * kTile && first_b < a.m && first_col < a.n;
  auto bias_at = [&](int64_t col) { return a.bias ? to_acc(static_cast<const T*>(a.bias)[col * a.bias_stride]) : 0.f; };
  const float first_bias = first_live ? bias_at(first_col) : 0.f;
  wait_for_prior_grids();
  chain_next_grids();
  // x to shared memory in one batch of loads: read from global memory inside the loop, each chunk's mma would
  // wait for its own L2 round trip (the stores and waits around the loads keep them from being issued early).
  const bool x_staged = kNorm || a.x_pitch > 0;  // the host's choice for a plain product (kMaxStagedPlainRows)
  if constexpr (kNorm) {  // both have barriers: every warp of the CTA calls them
    if (a.x_norm_weight) stage_x_own_norm<kThreads>(a, sx, sgx, &partial[0][0]);
    stage_normalized_x<kThreads>(a, sx, sg, &partial[0][0]);
  } else if (x_staged) {
    stage_x<kThreads>(a, sx);
    __syncthreads();
  }
  const T* addend = static_cast<const T*>(a.addend);
  auto addend_at = [&](int b, int64_t col) { return to_acc(addend[b * static_cast<int64_t>(a.n) + col]); };
  const float first_addend = addend && first_live ? addend_at(first_b, first_col) : 0.f;

  // Two accumulators, one per mma of a chunk: each mma waits for the one a chunk back, not for the one just
  // before it (one chain of 2 x chunks dependent mma was the warp's critical path).
  float d[4] = {0.f, 0.f, 0.f, 0.f}, d_hi[4] = {0.f, 0.f, 0.f, 0.f};
  if (live) {
    const bool x_live = g < a.m;
    const T* x_lane = x_staged ? sx + (x_live ? g : 0) * a.x_pitch + t * 8
                               : static_cast<const T*>(a.x) + (x_live ? g : 0) * a.x_stride + t * 8;
    for (int c = c_begin; c < c_end; ++c) {  // warp-uniform bounds, as mma.sync needs
      copy_async_wait_group<kRingSlots - 1>();  // chunk c has landed: only the kRingSlots - 1 after it may not
      const bool in_k = c * kChunk + t * 8 < a.k;
      const uint4 wv = in_k ? *slot(c) : make_uint4(0, 0, 0, 0);
      const uint4 xv = x_live && in_k ? *reinterpret_cast<const uint4*>(x_lane + c * kChunk) : make_uint4(0, 0, 0, 0);
      // A rows g (x row g) and g + 8 (zero); k pairs (2t, 2t+8) <- elements (8t, 8t+2) then (8t+4, 8t+6).
      const uint32_t a_lo[4] = {xv.x, 0u, xv.y, 0u}, a_hi[4] = {xv.z, 0u, xv.w, 0u};
      attn::mma_16816<T>(d, a_lo, wv.x, wv.y);
      attn::mma_16816<T>(d_hi, a_hi, wv.z, wv.w);
      fetch(c + kRingSlots);  // into the slot just read (its value is in registers, consumed above)
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] += d_hi[i];
  // d[0], d[1] = (x row g, weight row 2t / 2t + 1 of the group); d[2], d[3] belong to A's zero rows.
  partial[warp][g * kGroupRows + 2 * t] = d[0];
  partial[warp][g * kGroupRows + 2 * t + 1] = d[1];
  __syncthreads();
  T* out = static_cast<T*>(a.out);
  for (int e = static_cast<int>(threadIdx.x); e < out_groups * kTile; e += kThreads) {
    const int group = e / kTile, b = e % kTile / kGroupRows, r = e % kGroupRows;
    const int64_t col = (group0 + group) * kGroupRows + r;
    if (b >= a.m || col >= a.n) continue;
    float acc[kStreams] = {};
#pragma unroll
    for (int s = 0; s < kStreams; ++s) {
      const int first_warp = (group * kStreams + s) * kSplit;
      for (int split = 0; split < kSplit; ++split) acc[s] += partial[first_warp + split][b * kGroupRows + r];
    }
    float y;
    if constexpr (kGated) {  // the gate on the rounded gate_up product (math::swiglu / math::geglu, as activation.cu)
      const float gate = to_acc(from_acc<T>(acc[0])), up = to_acc(from_acc<T>(acc[kStreams - 1]));
      if constexpr (kGate == GatedActivation::swiglu) {
        y = math::swiglu(gate, up);
      } else {
        y = math::geglu(gate, up, [](float v) { return round_to<T>(v); });
      }
    } else {
      const bool first = e == first_e;
      y = acc[0] + (first ? first_bias : bias_at(col));
      if (addend) y += first ? first_addend : addend_at(b, col);
    }
    out[b * static_cast<int64_t>(a.n) + col] = from_acc<T>(y);
  }
}

struct GemvLaunch {
  int split, threads, chunks_per_warp;
  unsigned blocks;
};

// The launch shape from n, k, the weight streams per output group and the SM count only (the header
// comment, point 3). A CTA holds whole output groups: all their streams and k slices.
GemvLaunch plan_launch(int64_t n, int64_t k, int streams, int sms) {
  const int64_t groups = (n + kGroupRows - 1) / kGroupRows, chunks = (k + kChunk - 1) / kChunk;
  const int64_t runs = (chunks + kMinChunksPerWarp - 1) / kMinChunksPerWarp;  // the most slices k allows
  const int64_t target = static_cast<int64_t>(sms) * kWarpsTarget;
  int split = 1;
  while (split < kMaxSplit / streams && split < runs && groups * streams * split < target) split *= 2;
  GemvLaunch l{};
  l.split = split;
  // At least 4 warps a CTA; one output group from split 4 up, so that few groups still spread over many SMs.
  l.threads = 32 * std::max(split * streams, 4);
  l.chunks_per_warp = static_cast<int>((chunks + split - 1) / split);
  const int64_t groups_per_cta = l.threads / 32 / split / streams;
  l.blocks = static_cast<unsigned>((groups + groups_per_cta - 1) / groups_per_cta);
  return l;
}

// 16-byte loads of row-major rows: unit inner stride, aligned base, and whole 16-byte packs between the rows
// that are read.
bool rows_of_packs(const Tensor& t, int64_t rows) {
  return t.stride(-1) == 1 && rows::aligned16(t.data_ptr()) && (rows <= 1 || t.stride(0) % 8 == 0);
}

// The GEMV's shape conditions, shared by try_decode_gemv and folds_rms_norm_linear: x of m rows, weight w
// [rows, k] (gated: [w_gate; w_up]) of a 16-bit float dtype; folded: with the RMSNorm and/or a gate, whose
// limits are tighter (the header comment, "Where it runs"). Layouts, staging room and the switch are checked
// where the product is launched.
bool takes_shape(int64_t m, const Tensor& w, bool folded, bool gated) {
  const DType dtype = w.dtype();
  if ((dtype != DType::bf16 && dtype != DType::f16) || w.dim() != 2) return false;
  const int64_t rows = w.size(0), k = w.size(1);
  if (m < 1 || m > (folded ? kMaxFoldedRows : kGemvMaxRows) || k < 1 || k % 8 != 0 || k >= INT_MAX) return false;
  if (rows < 1 || rows >= INT_MAX || (gated && rows % 2 != 0)) return false;
  return w.numel() * static_cast<int64_t>(w.element_size()) <= (folded ? kMaxFoldedBytes : kMaxPlainBytes);
}

}  // namespace

bool try_decode_gemv(const Tensor& x, const Tensor& w, const void* bias, int64_t bias_stride, const Tensor& out,
                     cudaStream_t stream, const GemvNorm* norm, GatedActivation gate, const char* scope,
                     const void* addend) {
  const DType dtype = w.dtype();
  if (x.dim() != 2 || out.dim() != 2 || x.dtype() != dtype || out.dtype() != dtype) return false;
  const bool gated = gate != GatedActivation::none;
  if (!takes_shape(x.size(0), w, /*folded=*/norm != nullptr || gated, gated) || x.size(1) != w.size(1)) return false;
  if (gated && (bias != nullptr || addend != nullptr)) return false;
  if (gate == GatedActivation::geglu && !norm) return false;  // compiled with the RMSNorm only (Gemma's gate_up)
  const int64_t m = x.size(0), k = x.size(1), n = gated ? w.size(0) / 2 : w.size(0);
  if (out.size(0) != m || out.size(1) != n || !out.is_contiguous()) return false;
  if (!rows_of_packs(x, m) || !rows_of_packs(w, w.size(0))) return false;
  const int64_t x_pitch = k + 16 / static_cast<int64_t>(x.element_size());
  // kNorm stages the normalized x (and the norm weight) always; a plain product stages x up to
  // kMaxStagedPlainRows rows where it fits, and otherwise reads it from global memory inside its loop.
  const size_t plain_x_bytes = static_cast<size_t>(m * x_pitch * x.element_size());
  const bool plain_x_staged = !norm && m <= kMaxStagedPlainRows && plain_x_bytes <= kMaxStaged;
  const int64_t norm_weights = norm ? (norm->x_weight.defined() ? 2 : 1) : 0;
  const size_t staged_bytes = norm ? static_cast<size_t>((m * x_pitch + norm_weights * k) * x.element_size())
                                   : (plain_x_staged ? plain_x_bytes : 0);
  if (norm) {
    const Tensor& res = norm->residual;
    const Tensor& gamma = norm->weight;
    auto norm_weight_fits = [&](const Tensor& g) {
      return g.dim() == 1 && g.size(0) == k && g.dtype() == dtype && rows_of_packs(g, 1);
    };
    if (staged_bytes > kMaxStaged || !norm_weight_fits(gamma) ||
        (norm->x_weight.defined() && !norm_weight_fits(norm->x_weight))) {
      return false;
    }
    if (res.defined() && (res.dtype() != dtype || res.dim() != 2 || res.size(0) != m || res.size(1) != k ||
                          !rows_of_packs(res, m))) {
      return false;
    }
    if (norm->h_out.defined() && (norm->h_out.dtype() != dtype || norm->h_out.numel() != m * k ||
                                  !norm->h_out.is_contiguous() || !rows::aligned16(norm->h_out.data_ptr()))) {
      return false;
    }
  }
  if (!decode_gemv()) return false;
  const GemvLaunch l = plan_launch(n, k, gated ? 2 : 1, multiprocessor_count(out.device().index));

  GemvArgs a{};
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.w = w.data_ptr();
  a.w_stride = w.stride(0);
  a.bias = bias;
  a.bias_stride = bias_stride;
  a.out = out.data_ptr();
  a.addend = addend;
  a.m = static_cast<int>(m);
  a.n = static_cast<int>(n);
  a.k = static_cast<int>(k);
  a.up_row0 = n;
  if (norm) {
    a.residual = norm->residual.defined() ? norm->residual.data_ptr() : nullptr;
    a.residual_stride = norm->residual.defined() ? norm->residual.stride(0) : 0;
    a.norm_weight = norm->weight.data_ptr();
    a.x_norm_weight = norm->x_weight.defined() ? norm->x_weight.data_ptr() : nullptr;
    a.eps = static_cast<float>(norm->eps);
    a.h_out = norm->h_out.defined() ? norm->h_out.data_ptr() : nullptr;
  }
  if (norm || plain_x_staged) a.x_pitch = static_cast<int>(x_pitch);  // 0: x read from global memory
  a.chunks_per_warp = l.chunks_per_warp;
  const int device = out.device().index;
  std::optional<OpScope> op_scope;
  if (scope) op_scope.emplace(scope, device, stream);
  auto launch_split = [&]<typename T, bool kNorm, GatedActivation kGate, int kSplit>() {
    // The rings of 512 threads and the staged rows pass the 48 KB of dynamic shared memory that need no opt-in.
    constexpr auto kernel = decode_gemv_kernel<T, kNorm, kGate, kSplit>;
    raise_smem_limit<kernel>(kMaxThreads * kRingBytesPerThread + kMaxStaged, device);
    launch_chained(kernel, l.blocks, l.threads, static_cast<size_t>(l.threads) * kRingBytesPerThread + staged_bytes,
                   stream, device, a);
  };
  auto launch = [&]<typename T, bool kNorm, GatedActivation kGate>() {
    constexpr bool kGated = kGate != GatedActivation::none;
    switch (l.split) {  // plan_launch's powers of two up to kMaxSplit / streams
      case 1: return launch_split.template operator()<T, kNorm, kGate, 1>();
      case 2: return launch_split.template operator()<T, kNorm, kGate, 2>();
      case 4: return launch_split.template operator()<T, kNorm, kGate, 4>();
      case 8: return launch_split.template operator()<T, kNorm, kGate, 8>();
      default:
        MICROLLM_CHECK(!kGated && l.split == 16, BackendError, "decode_gemv", "no kernel for split ", l.split);
        if constexpr (!kGated) launch_split.template operator()<T, kNorm, kGate, 16>();
    }
  };
  auto launch_folds = [&]<typename T>() {
    using G = GatedActivation;
    if (norm && gate == G::geglu) launch.template operator()<T, true, G::geglu>();
    else if (norm && gate == G::swiglu) launch.template operator()<T, true, G::swiglu>();
    else if (norm) launch.template operator()<T, true, G::none>();
    else if (gate == G::swiglu) launch.template operator()<T, false, G::swiglu>();
    else launch.template operator()<T, false, G::none>();
  };
  if (dtype == DType::bf16) launch_folds.template operator()<__nv_bfloat16>();
  else launch_folds.template operator()<__half>();
  return true;
}

}  // namespace microllm::cuda_kernels

namespace microllm {

namespace {

void record_choice_of_rms_norm_linear(const Tensor& x, const Tensor& x_norm_weight, const Tensor& weight,
                                      GatedActivation gate, const char* choice) {
  if (!recording_kernel_choices()) return;
  std::string op = "rms_norm_linear";
  if (x_norm_weight.defined()) op += " (x normalized first)";
  if (gate != GatedActivation::none) op += std::string(" (") + gated_activation_name(gate) + ")";
  record_kernel_choice(op,
                       "rows " + std::to_string(x.size(0)) + ", weight " + std::to_string(weight.size(0)) + "x" +
                           std::to_string(weight.size(1)),
                       choice);
}

}  // namespace

// try_decode_gemv's folded case by shape (its layout conditions hold for the model's tensors).
bool CudaFusions::folds_rms_norm_linear(int64_t rows, const Tensor& weight, GatedActivation gate) const {
  return decode_gemv() && cuda_kernels::takes_shape(rows, weight, /*folded=*/true, gate != GatedActivation::none);
}

// The decode GEMV with the RMSNorms (and the gate) folded in when it takes the shapes; else the composition (whose
// linear_swiglu runs the Hopper SwiGLU GEMM at prefill size: gemm_swiglu_sm90.cu).
void CudaFusions::rms_norm_linear(const Tensor& x, const Tensor& x_norm_weight, const Tensor& residual,
                                  const Tensor& norm_weight, double eps, const Tensor& weight, const Tensor& bias,
                                  GatedActivation gate, const Tensor& out, const Tensor& h_out) {
  {
    const cuda_kernels::Launch launch(out);
    const cuda_kernels::GemvNorm norm{residual, norm_weight, eps, h_out, x_norm_weight};
    if (cuda_kernels::try_decode_gemv(x, weight, bias.defined() ? bias.data_ptr() : nullptr,
                                      bias.defined() ? bias.stride(0) : 0, out, launch.stream, &norm, gate,
                                      "rms_norm_linear")) {
      record_choice_of_rms_norm_linear(x, x_norm_weight, weight, gate, "decode GEMV with the RMSNorm folded in");
      return;
    }
  }
  const char* product = gate == GatedActivation::swiglu  ? ", linear_swiglu"
                        : gate == GatedActivation::geglu ? ", matmul, geglu"
                                                         : ", matmul";
  const std::string composition =
      std::string("composition: ") + (x_norm_weight.defined() ? "sandwich_rms_norm" : "rms_norm") + product;
  record_choice_of_rms_norm_linear(x, x_norm_weight, weight, gate, composition.c_str());
  // Declined: the composition, each kernel timed under its own op (sandwich_rms_norm or rms_norm, matmul, the gate).
  Fusions::rms_norm_linear(x, x_norm_weight, residual, norm_weight, eps, weight, bias, gate, out, h_out);
}

}  // namespace microllm
