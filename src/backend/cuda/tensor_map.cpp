#include "tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "../../core/cuda/cuda_check.h"
#include "microllm/core/error.h"

namespace microllm::cuda_kernels {
namespace {

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled(const char* op) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MICROLLM_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    return found == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn) : nullptr;
  }();
  if (encode == nullptr) throw BackendError(op, "the CUDA driver has no cuTensorMapEncodeTiled");
  return encode;
}

}  // namespace

CUtensorMap swizzled_map(const char* op, const void* base, DType dtype, int rank, const int64_t* dims,
                         const int64_t* byte_strides, const uint32_t* box) {
  MICROLLM_CHECK(rank >= 1 && rank <= 5 && (dtype == DType::bf16 || dtype == DType::f16), BackendError, op,
                 "tensor map of rank ", rank, " and dtype ", dtype, ": 1-5 dimensions of bf16 or f16");
  cuuint64_t global_dims[5], global_strides[4];
  cuuint32_t box_dims[5], element_strides[5];
  for (int i = 0; i < rank; ++i) {
    global_dims[i] = static_cast<cuuint64_t>(dims[i]);
    box_dims[i] = box[i];
    element_strides[i] = 1;
    if (i > 0) global_strides[i - 1] = static_cast<cuuint64_t>(byte_strides[i - 1]);
  }
  CUtensorMap map{};
  const CUresult result = encode_tiled(op)(
      &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      static_cast<cuuint32_t>(rank), const_cast<void*>(base), global_dims, global_strides, box_dims, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    std::string shape, strides;
    for (int i = 0; i < rank; ++i) shape += str_cat(i ? ", " : "", dims[i]);
    for (int i = 0; i + 1 < rank; ++i) strides += str_cat(i ? ", " : "", byte_strides[i]);
    throw BackendError(op, str_cat("cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(result),
                                   ") for dims [", shape, "] (innermost first) at byte strides [", strides, "] from ",
                                   base));
  }
  return map;
}

}  // namespace microllm::cuda_kernels
