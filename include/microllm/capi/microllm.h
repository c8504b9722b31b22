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

/* Devices: how many CUDA devices this build and machine have (0 on CPU-only builds or machines). */
int microllm_cuda_device_count(void);

/* Models: a Hugging Face folder or a microllm checkpoint, loaded on `device` ("cpu", "cuda", "cuda:N") with
 * weights and compute in `dtype` ("f32", "bf16"; "f64" on the CPU), with the folder's tokenizer when it has one. */
typedef struct microllm_model microllm_model;
microllm_status microllm_model_load(const char* directory, const char* device, const char* dtype,
                                    microllm_model** out);
void microllm_model_free(microllm_model* model);
int64_t microllm_model_vocab_size(const microllm_model* model);
/* The logits [batch, length, vocab] (f32, on the CPU) of ids [batch, length] (row-major). */
microllm_status microllm_model_logits(const microllm_model* model, const int64_t* ids, int64_t batch, int64_t length,
                                      microllm_tensor** out);

/* Text. Buffers follow one rule: the call writes at most `capacity` elements and sets *count (or *length) to how
 * many the whole result has; a result larger than the buffer is MICROLLM_ERROR_VALUE with *count set, so the
 * caller can grow the buffer and call again. Text is UTF-8 and NUL-terminated when it fits (length excludes it). */
typedef struct microllm_tokenizer microllm_tokenizer;
/* A tokenizer.json (file, or a folder with it and tokenizer_config.json, or GPT-2's vocab.json + merges.txt). */
microllm_status microllm_tokenizer_load(const char* path, microllm_tokenizer** out);
/* The model's own tokenizer: owned by the model (do not free it); MICROLLM_ERROR_VALUE when the folder had none. */
microllm_status microllm_model_tokenizer(const microllm_model* model, const microllm_tokenizer** out);
void microllm_tokenizer_free(microllm_tokenizer* tokenizer);
microllm_status microllm_tokenize(const microllm_tokenizer* tokenizer, const char* text, int add_special_tokens,
                                  int32_t* ids, size_t capacity, size_t* count);
microllm_status microllm_detokenize(const microllm_tokenizer* tokenizer, const int32_t* ids, size_t count,
                                    int skip_special_tokens, char* text, size_t capacity, size_t* length);

/* Generation: the prompt encoded with the model's tokenizer (special tokens added), continued until max_tokens,
 * the model's window, or an end-of-sequence id (config.json's and the tokenizer's). temperature 0 is greedy. */
typedef struct microllm_sampling {
  int64_t max_tokens;
  double temperature, top_p, min_p, repetition_penalty;
  int64_t top_k;
  uint64_t seed;
} microllm_sampling;
/* Greedy, 256 tokens, no truncation or penalty, seed 0. */
microllm_sampling microllm_sampling_default(void);
microllm_status microllm_generate(const microllm_model* model, const char* prompt, const microllm_sampling* sampling,
                                  char* text, size_t capacity, size_t* length);

#ifdef __cplusplus
}
#endif

#endif /* MICROLLM_CAPI_MICROLLM_H */
