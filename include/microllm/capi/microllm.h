/* microLLM C API: a stable C ABI over the C++ library. This is the one layer that catches exceptions:
 * every function returns a status, and microllm_last_error() gives the message of the last failure on
 * the calling thread. Tensors are opaque handles owned by the caller (free with microllm_tensor_free). */
#ifndef MICROLLM_CAPI_MICROLLM_H
#define MICROLLM_CAPI_MICROLLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum microllm_status {
  MICROLLM_OK = 0,
  MICROLLM_ERROR_VALUE = 1,         /* bad argument value */
  MICROLLM_ERROR_SHAPE = 2,
  MICROLLM_ERROR_DTYPE = 3,
  MICROLLM_ERROR_DEVICE = 4,
  MICROLLM_ERROR_INDEX = 5,
  MICROLLM_ERROR_NOT_SUPPORTED = 6,
  MICROLLM_ERROR_IO = 7,
  MICROLLM_ERROR_OUT_OF_MEMORY = 8,
  MICROLLM_ERROR_BACKEND = 9,
  MICROLLM_ERROR_INTERNAL = 10
} microllm_status;

/* Same order as microllm::DType. */
typedef enum microllm_dtype {
  MICROLLM_F32 = 0, MICROLLM_F16, MICROLLM_BF16, MICROLLM_F64, MICROLLM_I8, MICROLLM_U8, MICROLLM_I32,
  MICROLLM_I64, MICROLLM_F8_E4M3FN, MICROLLM_F8_E5M2
} microllm_dtype;

typedef struct microllm_tensor microllm_tensor;

const char* microllm_version(void);
/* The message of the last failed call on this thread ("" when none). Valid until the next call. */
const char* microllm_last_error(void);

/* A new CPU tensor holding a copy of `data` (dtype, shape[rank] row-major). */
microllm_status microllm_tensor_from_data(const void* data, microllm_dtype dtype, const int64_t* shape, int rank,
                                          microllm_tensor** out);
/* Standard normal values from a seeded generator. */
microllm_status microllm_tensor_randn(const int64_t* shape, int rank, microllm_dtype dtype, uint64_t seed,
                                      microllm_tensor** out);
void microllm_tensor_free(microllm_tensor* tensor);

int microllm_tensor_rank(const microllm_tensor* tensor);
int64_t microllm_tensor_dim(const microllm_tensor* tensor, int dim);
int64_t microllm_tensor_numel(const microllm_tensor* tensor);
microllm_dtype microllm_tensor_dtype(const microllm_tensor* tensor);
/* Copies all elements, converted to f32, into `dst` (capacity in elements). */
microllm_status microllm_tensor_to_f32(const microllm_tensor* tensor, float* dst, size_t capacity);

/* Operators (new tensors in *out). */
microllm_status microllm_add(const microllm_tensor* a, const microllm_tensor* b, microllm_tensor** out);
microllm_status microllm_matmul(const microllm_tensor* a, const microllm_tensor* b, int transpose_a, int transpose_b,
                                microllm_tensor** out);
microllm_status microllm_rms_norm(const microllm_tensor* x, const microllm_tensor* weight, double eps,
                                  microllm_tensor** out);
microllm_status microllm_softmax(const microllm_tensor* x, int64_t dim, microllm_tensor** out);

#ifdef __cplusplus
}
#endif

#endif /* MICROLLM_CAPI_MICROLLM_H */
