// Warp-level tensor-core building blocks of the flash attention kernels (internal header): cp.async
// copies, ldmatrix, mma.sync m16n8k16 (bf16/f16 in, f32 accumulate) and the shared-memory swizzle.
// These are the CUDA-only (inline PTX) pieces of the attention family; a HIP port replaces this file.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group); each .b32 register holds two 16-bit
// elements, the lower column (or k) index in the low half:
//   A 16x16 (row-major): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B 16x8  (k x n)     : b0 = (k 2t..2t+1, n g)               b1 = (k 2t+8.., n g)
//   C 16x8  (f32)       : c0, c1 = (g, 2t), (g, 2t+1)          c2, c3 = (g+8, 2t), (g+8, 2t+1)
// ldmatrix.x4 (PTX "ldmatrix"): lanes 8m..8m+7 give the row addresses (16 bytes each) of 8x8 matrix m,
// and register m of every lane receives matrix m: without .trans lane l gets (row l/4, cols 2(l%4),
// 2(l%4)+1); with .trans it gets (rows 2(l%4), 2(l%4)+1, col l/4), i.e. the matrix transposed.
// The *_lane_row / *_lane_chunk helpers below give, for each use, the tile row and 16-byte chunk whose
// address a lane passes. They were checked, for every warp role of both flash kernels, by a host
// emulation of ldmatrix and mma written from the definitions above.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "microllm/backend/portability.h"

namespace microllm::cuda_kernels::attn {

// Tiles in shared memory are row-major arrays of 16-byte chunks (8 elements). Chunk c of row r is stored
// at chunk c ^ (r % 8) of that row: the 8 rows one ldmatrix matrix reads (same logical chunk) then fall
// in 8 different 16-byte bank groups, and a warp's cp.async writes of whole rows stay conflict-free.
// Needs chunks_per_row >= 8 (rows of at least 64 elements).
MICROLLM_HD constexpr int swizzle(int row, int chunk, int chunks_per_row) {
  return row * chunks_per_row + (chunk ^ (row & 7));
}

// Byte offset of the address a lane passes for the 16x16 block at rows row0.. (a multiple of 8) and chunk
// pair kk (chunks 2kk, 2kk + 1), given `lane_off`, its byte offset for the block at (0, 0). Logical chunk
// 2kk + c (c = 0 or 1) of row r is stored at (2kk + c) ^ (r % 8) = (c ^ (r % 8)) ^ 2kk: moving by chunk
// pairs flips chunk bits only, which never overlap the row bits of the offset (rows are >= 8 chunks), and
// whole rows add. So each operand pattern needs one per-lane register, not one address per k step.
MICROLLM_HD constexpr uint32_t block_offset(uint32_t lane_off, int row0, int kk, int row_bytes) {
  return (lane_off ^ (static_cast<uint32_t>(kk) * 32u)) + static_cast<uint32_t>(row0 * row_bytes);
}

// Row (relative to the 16x16 block) and chunk (0 or 1, relative to the block's first chunk) that `lane`
// addresses when loading, with one ldmatrix.x4:
// A operand of a 16x16 row-major block (rows = m, chunks = k): registers a0..a3.
MICROLLM_HD constexpr int a_lane_row(int lane) { return lane & 15; }
MICROLLM_HD constexpr int a_lane_chunk(int lane) { return lane >> 4; }
// B operands of two n8 tiles stored [n][k] (K for S = Q K^T): rows n0..n0+15, chunks k0/8, k0/8+1;
// registers {b0, b1} of n tile 0 and {b0, b1} of n tile 1. The same addresses, loaded with .trans, give
// the A operand of a 16x16 block stored transposed ([k][m], e.g. P^T from P [query][key]).
MICROLLM_HD constexpr int nk_lane_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
MICROLLM_HD constexpr int nk_lane_chunk(int lane) { return (lane >> 3) & 1; }
// B operands (with .trans) of two n8 tiles stored [k][n] (V for O = P V): rows k0..k0+15, chunks n0/8,
// n0/8+1; registers {b0, b1} of n tile 0 and {b0, b1} of n tile 1.
MICROLLM_HD constexpr int kn_lane_row(int lane) { return (lane & 7) + (((lane >> 3) & 1) << 3); }
MICROLLM_HD constexpr int kn_lane_chunk(int lane) { return lane >> 4; }

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; valid == false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ROWS x D tile: rows row0.. of `src` (row stride `stride`) -> shared memory, 16-byte chunk ch of tile row r at
// byte dst + offset(r, ch) (the kernel's swizzled layout), one cp.async a chunk by THREADS threads; rows >= limit
// are zero-filled, so padding never feeds NaN garbage into the MMA (0 * NaN would poison P V). A source row holds
// DATA <= D columns: the columns past them are zero-filled too (a head dim padded to the tile's).
template <int ROWS, int D, int THREADS, int DATA = D, typename T, typename Offset>
__device__ __forceinline__ void copy_rows_async(uint32_t dst, const T* src, int64_t stride, int row0, int limit,
                                                Offset offset) {
  constexpr int kChunks = D / 8, kTotal = ROWS * kChunks;
  static_assert(kTotal % THREADS == 0, "whole chunks per thread");
  static_assert(DATA % 8 == 0 && DATA <= D, "whole chunks of data");
#pragma unroll
  for (int n = 0; n < kTotal / THREADS; ++n) {
    const int c = n * THREADS + static_cast<int>(threadIdx.x);
    const int r = c / kChunks, ch = c % kChunks;
    const bool valid = row0 + r < limit && ch < DATA / 8;
    const T* from = valid ? src + static_cast<int64_t>(row0 + r) * stride + ch * 8 : src;
    cp_async_16(dst + offset(r, ch), from, valid);
  }
}
// The row-major swizzled layout above: chunk ch of row r at byte swizzle(r, ch, D / 8) * 16.
template <int ROWS, int D, int THREADS, int DATA = D, typename T>
__device__ __forceinline__ void copy_rows_swizzled(T* smem, const T* src, int64_t stride, int row0, int limit) {
  copy_rows_async<ROWS, D, THREADS, DATA>(smem_u32(smem), src, stride, row0, limit, [](int r, int ch) {
    return static_cast<uint32_t>(swizzle(r, ch, D / 8)) * 16u;
  });
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one 16x8x16 tile, f32 accumulation; T is __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma_16816 takes bf16 or f16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T and packed into one register, `lo` in the low half (the lower index).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

#endif  // __CUDACC__

}  // namespace microllm::cuda_kernels::attn
