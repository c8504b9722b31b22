// Tensor factories. Values are made on the host and moved to the device; ops never do that.
#include <cmath>

#include "device_runtime.h"
#include "element.h"
#include "microllm/core/tensor.h"
#include "parallel.h"

namespace microllm {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const int64_t count = shape.numel();
  auto storage = Storage::allocate(static_cast<size_t>(count) * dtype_size(dtype), device);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device, std::shared_ptr<void> keep_alive) {
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  MICROLLM_CHECK(data != nullptr || nbytes == 0, ValueError, "from_blob", "null data for shape ", shape);
  return Tensor(Storage::wrap(data, nbytes, device, std::move(keep_alive)), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  if (device.is_cuda()) {  // filled on the device: no host transfer
    Tensor out = empty(shape, dtype, device);
    detail::cuda_fill(out, value);
    return out;
  }
  Tensor host = empty(shape, dtype, Device::cpu());
  detail::visit_dtype(dtype, [&]<typename T>() {
    const T filled = detail::convert_element<T>(value);
    T* data = host.data<T>();
    detail::parallel_for(0, host.numel(), detail::kParallelGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) data[i] = filled;
    });
  });
  return host.to(device);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor Tensor::scalar(double value, DType dtype, Device device) { return full(Shape{}, value, dtype, device); }

Tensor Tensor::arange(double start, double end, double step, DType dtype, Device device) {
  MICROLLM_CHECK(step != 0 && std::isfinite(step) && std::isfinite(start) && std::isfinite(end), ValueError, "arange",
                 "invalid range start=", start, " end=", end, " step=", step);
  const double steps = std::max(0.0, std::ceil((end - start) / step));
  MICROLLM_CHECK(steps < 9.0e15, ValueError, "arange", "range start=", start, " end=", end, " step=", step,
                 " has too many elements");
  const auto count = static_cast<int64_t>(steps);
  Tensor host = empty(Shape{count}, dtype, Device::cpu());
  detail::visit_dtype(dtype, [&]<typename T>() {
    T* data = host.data<T>();
    for (int64_t i = 0; i < count; ++i) data[i] = detail::convert_element<T>(start + static_cast<double>(i) * step);
  });
  return host.to(device);
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, Device device, double mean, double std) {
  MICROLLM_CHECK(is_floating(dtype), DTypeError, "randn", "needs a floating dtype, got ", dtype);
  const int64_t count = shape.numel();
  // Each Philox block gives four words, i.e. two Box-Muller pairs: element i uses block first + i / 4.
  const uint64_t first = gen.reserve(static_cast<uint64_t>((count + 3) / 4));
  const uint64_t key = gen.seed();
  Tensor values = empty(shape, DType::f32, Device::cpu());
  float* data = values.data<float>();
  detail::parallel_for(0, (count + 3) / 4, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t block = lo; block < hi; ++block) {
      const auto words = philox4x32(key, 0, first + static_cast<uint64_t>(block));
      float normals[4];
      box_muller(words[0], words[1], normals);
      box_muller(words[2], words[3], normals + 2);
      for (int j = 0; j < 4 && block * 4 + j < count; ++j) {
        data[block * 4 + j] = static_cast<float>(mean + std * static_cast<double>(normals[j]));
      }
    }
  });
  return values.to(device, dtype);
}

Tensor Tensor::uniform(const Shape& shape, Generator& gen, double low, double high, DType dtype, Device device) {
  MICROLLM_CHECK(is_floating(dtype), DTypeError, "uniform", "needs a floating dtype, got ", dtype);
  MICROLLM_CHECK(low <= high, ValueError, "uniform", "low ", low, " exceeds high ", high);
  const int64_t count = shape.numel();
  const uint64_t first = gen.reserve(static_cast<uint64_t>((count + 3) / 4));
  const uint64_t key = gen.seed();
  Tensor values = empty(shape, DType::f32, Device::cpu());
  float* data = values.data<float>();
  detail::parallel_for(0, (count + 3) / 4, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t block = lo; block < hi; ++block) {
      const auto words = philox4x32(key, 0, first + static_cast<uint64_t>(block));
      for (int j = 0; j < 4 && block * 4 + j < count; ++j) {
        data[block * 4 + j] = static_cast<float>(low + (high - low) * uniform_from_bits(words[j]));
      }
    }
  });
  // Rounding to the dtype can land on `high` (f16 keeps 11 bits; any dtype when |high| >> high - low).
  // Such draws become `low`, PyTorch's rule, so the range stays [low, high).
  Tensor out = values.to(dtype);
  detail::visit_dtype(dtype, [&]<typename T>() {
    T* p = out.data<T>();
    const T low_value = detail::convert_element<T>(low);
    detail::parallel_for(0, count, detail::kParallelGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (detail::convert_element<double>(p[i]) >= high) p[i] = low_value;
      }
    });
  });
  return out.to(device);
}

}  // namespace microllm
