// The C ABI: the only place that catches exceptions; each maps to a status and a thread-local message.
#include "microllm/capi/microllm.h"

#include <cstring>
#include <new>
#include <string>

#include "microllm/ops/ops.h"
#include "microllm/version.h"

struct microllm_tensor {
  microllm::Tensor tensor;
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

}  // extern "C"
