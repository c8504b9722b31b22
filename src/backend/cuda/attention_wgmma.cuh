// Hopper (sm_90a) building blocks of the flash attention forward and the SwiGLU GEMM (internal header): warpgroup
// MMA (wgmma) with its shared-memory matrix descriptors, async fences and m64nNk16 instructions; the mbarriers,
// TMA copies, named barriers and register hand-over of their warp-specialized producer/consumer designs.
// NVIDIA-only (inline PTX of sm_90a); a HIP port keeps the mma.sync kernel (attention_mma.cuh) instead.
//
// Operands in shared memory are tiles of 128-byte rows in "panels" of 64 bf16/f16 columns: panel p of an
// R x D tile holds columns 64p..64p+63 of every row, row r at byte 128 r of the panel, its 16-byte chunk c at
// chunk c ^ (r % 8) (PTX's 128-byte swizzle, Swizzle<3,4,3>, which the hardware applies to address bits
// 4-6 from bits 7-9; every panel starts on a 1024-byte boundary so the pattern lines up). In that layout
// (PTX ISA "Shared Memory Matrix Layout", canonical layouts with 128-byte swizzling):
//   K-major operand (A = Q [rows][d], B = K [keys][d] for S = Q K^T): 8-row groups 1024 bytes apart (the
//     stride byte offset); the leading byte offset is unused. A k16 step moves the start by 32 bytes inside
//     the panel (the swizzle is applied to the final address), and by a panel every 4 steps.
//   MN-major operand (B = V [keys][d] for O = P V, transposed): 8-key groups 1024 bytes apart (stride byte
//     offset), 64-column panels `panel bytes` apart (leading byte offset); a k16 step (16 keys) moves the start
//     by 2048 bytes.
// Register fragments (PTX "Matrix Fragments for wgmma.mma_async.m64nNk16"): warp w of the warpgroup owns rows
// 16w..16w+15, laid out as mma.sync's m16n8k16 fragments (attention_mma.cuh): accumulator d[4j + e] is row
// g + 8 (e / 2), column 8j + 2t + e % 2; the A fragment of a k16 step is mma.sync's A fragment.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace microllm::cuda_kernels::attn {

#if defined(__CUDACC__)

// 64-bit shared-memory matrix descriptor, 128-byte swizzle (PTX "Matrix Descriptor Format"): start address,
// leading and stride byte offsets, each in 16-byte units; base offset 0 (panels are 1024-byte aligned).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

// ---- mbarriers and the Tensor Memory Accelerator (sm_90): the producer/consumer rings of the Hopper kernels ----
// A ring stage has a "full" mbarrier its TMA copies complete (by bytes) and an "empty" one its consumers arrive
// on once they are done reading it. The descriptors come from tensor_map.h.

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the TMA unit (before the __syncthreads that publishes them).
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives on the barrier and adds `bytes` to the transactions its phase waits for (the TMA copies' bytes).
__device__ __forceinline__ void mbar_expect_bytes(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of this parity has completed (a fresh barrier: parity 1 has, 0 has not).
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Box (c0 innermost, c1) of a 2-D tensor map into shared memory at dst, completing its bytes on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// The same for a 4-D tensor map (c0 innermost).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Named barriers (ids 1-15; __syncthreads is 0) over `threads` threads: sync waits for the count, arrive counts
// without waiting (the warpgroups' turns at the tensor cores in the flash forward).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Hands registers between the warpgroups of a warp-specialized kernel (sm_90a): a producer gives back what it does
// not need, so that the consumers' accumulators fit. Every warp of the warpgroup executes it.
template <int N>
__device__ __forceinline__ void warpgroup_registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void warpgroup_registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Orders this warpgroup's register writes (accumulators, A fragments) before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma still in flight.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// m64n64k16: d[32] = A B (+ d when accumulate), A from shared memory (K-major), B K-major.
#define MICROLLM_WGMMA_SS_64(TYPES)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                               \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " "                        \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "%32, %33, p, 1, 1, 0, 0;\n}\n"                                         \
               : MICROLLM_WGMMA_D32(d)                                                       \
               : "l"(a), "l"(b), "r"(accumulate))
// m64n64k16: d[32] = A B (+ d when accumulate), A from registers, B MN-major (transposed).
#define MICROLLM_WGMMA_RS_64(TYPES)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                               \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " "                        \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                              \
               : MICROLLM_WGMMA_D32(d)                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
// m64n128k16: d[64] = A B (+ d when accumulate), A from shared memory (K-major), B K-major.
#define MICROLLM_WGMMA_SS_128(TYPES)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                               \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " "                        \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "%64, %65, p, 1, 1, 0, 0;\n}\n"                                         \
               : MICROLLM_WGMMA_D64(d)                                                       \
               : "l"(a), "l"(b), "r"(accumulate))
// m64n128k16: d[64] = A B (+ d when accumulate), A from registers, B MN-major (transposed).
#define MICROLLM_WGMMA_RS_128(TYPES)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                               \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " "                        \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                              \
               : MICROLLM_WGMMA_D64(d)                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
#define MICROLLM_WGMMA_D32(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MICROLLM_WGMMA_D64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (+)= A B over one k16 step: N = 64 or 128 columns; A a descriptor (K-major), B a descriptor (K-major).
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int accumulate) {
  static_assert(N == 64 || N == 128, "m64n64k16 or m64n128k16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (N == 64) MICROLLM_WGMMA_SS_64("bf16.bf16");
    else MICROLLM_WGMMA_SS_128("bf16.bf16");
  } else {
    static_assert(std::is_same_v<T, __half>, "wgmma takes bf16 or f16");
    if constexpr (N == 64) MICROLLM_WGMMA_SS_64("f16.f16");
    else MICROLLM_WGMMA_SS_128("f16.f16");
  }
}

// d (+)= A B over one k16 step: A the m64k16 fragment in registers, B a descriptor (MN-major).
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  static_assert(N == 64 || N == 128, "m64n64k16 or m64n128k16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (N == 64) MICROLLM_WGMMA_RS_64("bf16.bf16");
    else MICROLLM_WGMMA_RS_128("bf16.bf16");
  } else {
    static_assert(std::is_same_v<T, __half>, "wgmma takes bf16 or f16");
    if constexpr (N == 64) MICROLLM_WGMMA_RS_64("f16.f16");
    else MICROLLM_WGMMA_RS_128("f16.f16");
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
#endif  // __CUDACC__

}  // namespace microllm::cuda_kernels::attn
