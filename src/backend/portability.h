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
