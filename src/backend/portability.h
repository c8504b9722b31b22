// The thin layer between kernels and the vendor toolchain (internal header). Kernels spell
// host/device functions MICROLLM_HD, so the same formulas compile for the CPU, CUDA and (later) HIP.
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
#elif defined(__HIPCC__)
#define MICROLLM_SHFL_XOR(value, lane_mask) __shfl_xor((value), (lane_mask))
#define MICROLLM_SHFL(value, src_lane) __shfl((value), (src_lane))
#endif
