// The thin layer between kernels and the vendor toolchain: the backend layer's math headers (rope_math.h,
// sampling_math.h) and its kernels spell host/device functions MICROLLM_HD, so the same formulas compile for the
// CPU, CUDA and (later) HIP.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MICROLLM_HD __host__ __device__
#define MICROLLM_DEVICE __device__
#else
#define MICROLLM_HD
#define MICROLLM_DEVICE
#endif

// Warp shuffles: CUDA's *_sync forms with a full mask; HIP's wavefront of 64 needs its own port.
#if defined(__CUDACC__)
#define MICROLLM_SHFL_XOR(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask))
#define MICROLLM_SHFL(value, src_lane) __shfl_sync(0xffffffffu, (value), (src_lane))
// The lanes of the active threads whose `value` equals this lane's (sm_70+; HIP needs a loop of ballots).
#define MICROLLM_MATCH_ANY(value) __match_any_sync(__activemask(), (value))
// One bit per lane of the warp: whether `predicate` holds there (all 32 lanes must call it).
#define MICROLLM_BALLOT(predicate) __ballot_sync(0xffffffffu, (predicate))
#elif defined(__HIPCC__)
#define MICROLLM_SHFL_XOR(value, lane_mask) __shfl_xor((value), (lane_mask))
#define MICROLLM_SHFL(value, src_lane) __shfl((value), (src_lane))
#define MICROLLM_BALLOT(predicate) __ballot((predicate))
#endif

// f32 arithmetic rounded one operation at a time, never fused into an FMA: for formulas that must give the
// same bits on the host and on the device (sampling_math.h). nvcc contracts a * b + c into an FMA unless the
// _rn intrinsics spell the rounding out; host files that use these are compiled with -ffp-contract=off.
#if defined(__CUDA_ARCH__)
#define MICROLLM_FMUL_RN(a, b) __fmul_rn((a), (b))
#define MICROLLM_FADD_RN(a, b) __fadd_rn((a), (b))
#define MICROLLM_FDIV_RN(a, b) __fdiv_rn((a), (b))
#else
#define MICROLLM_FMUL_RN(a, b) ((a) * (b))
#define MICROLLM_FADD_RN(a, b) ((a) + (b))
#define MICROLLM_FDIV_RN(a, b) ((a) / (b))
#endif
