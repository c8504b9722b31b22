// The C ABI: the only place that catches exceptions; each maps to a status and a thread-local message.
#include "microllm/capi/microllm.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "microllm/autograd/variable.h"
#include "microllm/generate/generate.h"
#include "microllm/models/loader.h"
#include "microllm/ops/ops.h"
#include "microllm/tokenizer/tokenizer.h"
#include "microllm/version.h"

struct microllm_tensor {
  microllm::Tensor tensor;
};

struct microllm_tokenizer {
  microllm::Tokenizer tokenizer;
};

struct microllm_model {
  std::unique_ptr<microllm::nn::TransformerLM> model;
  microllm::Device device;
  microllm::DType dtype;
  std::optional<microllm_tokenizer> tokenizer;
};

namespace {

thread_local std::string g_last_error;

microllm_status fail(microllm_status status, const char* message) {
  g_last_error = message;
  return status;
}

// Runs `body`, turning every exception into a status.
template <typename Body>
microllm_status guarded(Body&& body) {
  try {
    g_last_error.clear();
    body();
    return MICROLLM_OK;
  } catch (const microllm::ShapeError& e) {
    return fail(MICROLLM_ERROR_SHAPE, e.what());
  } catch (const microllm::DTypeError& e) {
    return fail(MICROLLM_ERROR_DTYPE, e.what());
  } catch (const microllm::DeviceError& e) {
    return fail(MICROLLM_ERROR_DEVICE, e.what());
  } catch (const microllm::IndexError& e) {
    return fail(MICROLLM_ERROR_INDEX, e.what());
  } catch (const microllm::NotSupportedError& e) {
    return fail(MICROLLM_ERROR_NOT_SUPPORTED, e.what());
  } catch (const microllm::IoError& e) {
    return fail(MICROLLM_ERROR_IO, e.what());
  } catch (const microllm::ParseError& e) {
    return fail(MICROLLM_ERROR_IO, e.what());
  } catch (const microllm::OutOfMemoryError& e) {
    return fail(MICROLLM_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const microllm::BackendError& e) {
    return fail(MICROLLM_ERROR_BACKEND, e.what());
  } catch (const microllm::Error& e) {
    return fail(MICROLLM_ERROR_VALUE, e.what());
  } catch (const std::bad_alloc&) {
    return fail(MICROLLM_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(MICROLLM_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(MICROLLM_ERROR_INTERNAL, "unknown exception");
  }
}

microllm::DType to_dtype(microllm_dtype dtype) {
  MICROLLM_CHECK(dtype >= MICROLLM_F32 && dtype <= MICROLLM_F8_E5M2, microllm::ValueError, "capi", "unknown dtype ",
                 static_cast<int>(dtype));
  return static_cast<microllm::DType>(dtype);
}

microllm::Shape to_shape(const int64_t* shape, int rank) {
  MICROLLM_CHECK(rank >= 0 && rank <= microllm::kMaxDims, microllm::ShapeError, "capi", "rank ", rank,
                 " outside [0, ", microllm::kMaxDims, "]");
  MICROLLM_CHECK(shape != nullptr || rank == 0, microllm::ValueError, "capi", "shape is null");
  microllm::Shape out;
  for (int i = 0; i < rank; ++i) out.push_back(shape[i]);
  return out;
}

const microllm::Tensor& unwrap(const microllm_tensor* t, const char* name) {
  MICROLLM_CHECK(t != nullptr, microllm::ValueError, "capi", name, " is null");
  return t->tensor;
}

void emit(microllm::Tensor tensor, microllm_tensor** out) {
  MICROLLM_CHECK(out != nullptr, microllm::ValueError, "capi", "out is null");
  *out = new microllm_tensor{std::move(tensor)};
}

template <typename T>
const T& checked(const T* p, const char* name) {
  MICROLLM_CHECK(p != nullptr, microllm::ValueError, "capi", name, " is null");
  return *p;
}

// Copies `values` into out[capacity] and sets *count; a result larger than the buffer is an error after *count is
// set (the caller grows the buffer and calls again).
template <typename T>
void write_out(const T* values, size_t n, T* out, size_t capacity, size_t* count, const char* what) {
  MICROLLM_CHECK(count != nullptr, microllm::ValueError, "capi", "the count pointer is null");
  *count = n;
  MICROLLM_CHECK(n <= capacity, microllm::ValueError, "capi", "the ", what, " needs ", n, " elements, the buffer holds ",
                 capacity);
  MICROLLM_CHECK(out != nullptr || n == 0, microllm::ValueError, "capi", "the ", what, " buffer is null");
  if (n > 0) std::memcpy(out, values, n * sizeof(T));
}

void write_text(const std::string& text, char* out, size_t capacity, size_t* length) {
  write_out(text.data(), text.size(), out, capacity, length, "text");
  if (text.size() < capacity) out[text.size()] = '\0';
}

}  // namespace

extern "C" {

const char* microllm_version(void) { return MICROLLM_VERSION_STRING; }
const char* microllm_last_error(void) { return g_last_error.c_str(); }

microllm_status microllm_tensor_from_data(const void* data, microllm_dtype dtype, const int64_t* shape, int rank,
                                          microllm_tensor** out) {
  return guarded([&] {
    const microllm::Shape s = to_shape(shape, rank);
    const microllm::DType d = to_dtype(dtype);
    microllm::Tensor t = microllm::Tensor::empty(s, d);
    MICROLLM_CHECK(data != nullptr || t.nbytes() == 0, microllm::ValueError, "capi", "data is null");
    if (t.nbytes() > 0) std::memcpy(t.data_ptr(), data, t.nbytes());
    emit(std::move(t), out);
  });
}

microllm_status microllm_tensor_randn(const int64_t* shape, int rank, microllm_dtype dtype, uint64_t seed,
                                      microllm_tensor** out) {
  return guarded([&] {
    microllm::Generator gen(seed);
    emit(microllm::Tensor::randn(to_shape(shape, rank), gen, to_dtype(dtype)), out);
  });
}

void microllm_tensor_free(microllm_tensor* tensor) { delete tensor; }

int microllm_tensor_rank(const microllm_tensor* tensor) { return tensor ? tensor->tensor.dim() : -1; }

int64_t microllm_tensor_dim(const microllm_tensor* tensor, int dim) {
  if (!tensor || dim < 0 || dim >= tensor->tensor.dim()) return -1;
  return tensor->tensor.size(dim);
}

int64_t microllm_tensor_numel(const microllm_tensor* tensor) { return tensor ? tensor->tensor.numel() : -1; }

microllm_dtype microllm_tensor_dtype(const microllm_tensor* tensor) {
  return tensor ? static_cast<microllm_dtype>(tensor->tensor.dtype()) : MICROLLM_F32;
}

microllm_status microllm_tensor_to_f32(const microllm_tensor* tensor, float* dst, size_t capacity) {
  return guarded([&] {
    const microllm::Tensor& t = unwrap(tensor, "tensor");
    MICROLLM_CHECK(dst != nullptr, microllm::ValueError, "capi", "dst is null");
    MICROLLM_CHECK(capacity >= static_cast<size_t>(t.numel()), microllm::ValueError, "capi", "dst holds ", capacity,
                   " floats but the tensor has ", t.numel());
    const std::vector<float> values = t.to_vector<float>();
    std::memcpy(dst, values.data(), values.size() * sizeof(float));
  });
}

microllm_status microllm_add(const microllm_tensor* a, const microllm_tensor* b, microllm_tensor** out) {
  return guarded([&] { emit(microllm::add(unwrap(a, "a"), unwrap(b, "b")), out); });
}

microllm_status microllm_matmul(const microllm_tensor* a, const microllm_tensor* b, int transpose_a, int transpose_b,
                                microllm_tensor** out) {
  return guarded([&] {
    emit(microllm::matmul(unwrap(a, "a"), unwrap(b, "b"), transpose_a != 0, transpose_b != 0), out);
  });
}

microllm_status microllm_rms_norm(const microllm_tensor* x, const microllm_tensor* weight, double eps,
                                  microllm_tensor** out) {
  return guarded([&] { emit(microllm::rms_norm(unwrap(x, "x"), unwrap(weight, "weight"), eps), out); });
}

microllm_status microllm_softmax(const microllm_tensor* x, int64_t dim, microllm_tensor** out) {
  return guarded([&] { emit(microllm::softmax(unwrap(x, "x"), dim), out); });
}

int microllm_cuda_device_count(void) {
  try {
    return microllm::cuda_device_count();
  } catch (...) {
    return 0;
  }
}

microllm_status microllm_model_load(const char* directory, const char* device, const char* dtype,
                                    microllm_model** out) {
  return guarded([&] {
    MICROLLM_CHECK(directory != nullptr && out != nullptr, microllm::ValueError, "capi", "directory or out is null");
    microllm::models::LoadOptions options;
    options.device = microllm::Device::parse(device != nullptr ? device : "cpu");
    options.dtype = microllm::parse_dtype(dtype != nullptr ? dtype : "f32");
    auto model = std::make_unique<microllm_model>();
    model->model = microllm::models::load_model(directory, options).model;
    model->device = options.device;
    model->dtype = options.dtype;
    if (std::filesystem::exists(std::filesystem::path(directory) / "tokenizer.json"))
      model->tokenizer.emplace(microllm_tokenizer{microllm::Tokenizer::load(directory)});
    *out = model.release();
  });
}

void microllm_model_free(microllm_model* model) { delete model; }

int64_t microllm_model_vocab_size(const microllm_model* model) {
  return model != nullptr ? model->model->config().vocab_size : -1;
}

microllm_status microllm_model_logits(const microllm_model* model, const int64_t* ids, int64_t batch, int64_t length,
                                      microllm_tensor** out) {
  return guarded([&] {
    const microllm::nn::TransformerLM& m = *checked(model, "model").model;
    MICROLLM_CHECK(ids != nullptr && batch > 0 && length > 0, microllm::ValueError, "capi",
                   "logits: ids must be a non-empty [batch, length] array, got ", batch, " x ", length);
    const std::vector<int64_t> flat(ids, ids + batch * length);
    for (int64_t id : flat) {
      MICROLLM_CHECK(id >= 0 && id < m.config().vocab_size, microllm::IndexError, "capi", "logits: id ", id,
                     " is outside the vocabulary of ", m.config().vocab_size);
    }
    const microllm::Tensor input = microllm::Tensor::from_vector(flat, {batch, length}).to(model->device);
    microllm::autograd::NoGradGuard no_grad;
    microllm::nn::ForwardContext ctx;
    ctx.compute_dtype = model->dtype;
    emit(m.forward(input, ctx).value().to(microllm::Device::cpu(), microllm::DType::f32), out);
  });
}

microllm_status microllm_tokenizer_load(const char* path, microllm_tokenizer** out) {
  return guarded([&] {
    MICROLLM_CHECK(path != nullptr && out != nullptr, microllm::ValueError, "capi", "path or out is null");
    *out = new microllm_tokenizer{microllm::Tokenizer::load(path)};
  });
}

microllm_status microllm_model_tokenizer(const microllm_model* model, const microllm_tokenizer** out) {
  return guarded([&] {
    const microllm_model& m = checked(model, "model");
    MICROLLM_CHECK(out != nullptr, microllm::ValueError, "capi", "out is null");
    MICROLLM_CHECK(m.tokenizer.has_value(), microllm::ValueError, "capi", "the model's folder has no tokenizer.json");
    *out = &*m.tokenizer;
  });
}

void microllm_tokenizer_free(microllm_tokenizer* tokenizer) { delete tokenizer; }

microllm_status microllm_tokenize(const microllm_tokenizer* tokenizer, const char* text, int add_special_tokens,
                                  int32_t* ids, size_t capacity, size_t* count) {
  return guarded([&] {
    MICROLLM_CHECK(text != nullptr, microllm::ValueError, "capi", "text is null");
    const std::vector<int32_t> encoded = checked(tokenizer, "tokenizer").tokenizer.encode(text, add_special_tokens != 0);
    write_out(encoded.data(), encoded.size(), ids, capacity, count, "ids");
  });
}

microllm_status microllm_detokenize(const microllm_tokenizer* tokenizer, const int32_t* ids, size_t count,
                                    int skip_special_tokens, char* text, size_t capacity, size_t* length) {
  return guarded([&] {
    MICROLLM_CHECK(ids != nullptr || count == 0, microllm::ValueError, "capi", "ids is null");
    const std::vector<int32_t> all(ids, ids + count);
    write_text(checked(tokenizer, "tokenizer").tokenizer.decode(all, skip_special_tokens != 0), text, capacity, length);
  });
}

microllm_sampling microllm_sampling_default(void) {
  // max_tokens, temperature, top_p, min_p, repetition_penalty, top_k, seed
  return microllm_sampling{256, 0.0, 1.0, 0.0, 1.0, 0, 0};
}

microllm_status microllm_generate(const microllm_model* model, const char* prompt, const microllm_sampling* sampling,
                                  char* text, size_t capacity, size_t* length) {
  return guarded([&] {
    const microllm_model& m = checked(model, "model");
    MICROLLM_CHECK(prompt != nullptr, microllm::ValueError, "capi", "prompt is null");
    MICROLLM_CHECK(m.tokenizer.has_value(), microllm::ValueError, "capi",
                   "generate: the model's folder has no tokenizer.json");
    const microllm::Tokenizer& tok = m.tokenizer->tokenizer;
    const microllm_sampling s = sampling != nullptr ? *sampling : microllm_sampling_default();
    microllm::generate::GenerateOptions options;
    options.max_new_tokens = s.max_tokens;
    options.sampling.temperature = s.temperature;
    options.sampling.top_k = s.top_k;
    options.sampling.top_p = s.top_p;
    options.sampling.min_p = s.min_p;
    options.sampling.repetition_penalty = s.repetition_penalty;
    options.sampling.seed = s.seed;
    options.sampling.check();
    options.compute_dtype = m.dtype;
    for (int64_t id : m.model->config().eos_token_ids) options.stop_ids.push_back(id);
    if (const auto eos = tok.eos_token()) {
      if (const auto id = tok.token_to_id(*eos)) options.stop_ids.push_back(*id);
    }
    const std::vector<int32_t> ids = tok.encode(prompt, /*add_special_tokens=*/true);
    MICROLLM_CHECK(!ids.empty(), microllm::ValueError, "capi", "generate: the prompt encodes to no tokens");
    std::shared_ptr<microllm::StreamDecoder> stream =
        std::make_shared<microllm::StreamDecoder>(tok.stream_decoder(/*skip_special_tokens=*/true));
    const microllm::generate::TextDecoder decoder{[stream](int32_t id) { return stream->push(id); },
                                                  [stream] { return stream->finish(); }};
    write_text(microllm::generate::generate_text(*m.model, ids, options, decoder).text, text, capacity, length);
  });
}

}  // extern "C"
