// Tensor = Storage (shared, owns or borrows the bytes) + shape + strides + offset + dtype.
// The device is the storage's. Views share storage; copies are explicit (contiguous, clone, to).
// Strides and offset count elements, not bytes.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "microllm/core/device.h"
#include "microllm/core/dtype.h"
#include "microllm/core/error.h"
#include "microllm/core/random.h"
#include "microllm/core/shape.h"
#include "microllm/core/storage.h"

namespace microllm {

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  Tensor(std::shared_ptr<Storage> storage, const Shape& shape, const Strides& strides, int64_t offset, DType dtype);

  // ---- factories ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = Device::cpu());  // rank 0
  // [start, end) in steps of `step`, like torch.arange.
  static Tensor arange(double start, double end, double step = 1, DType dtype = DType::i64,
                       Device device = Device::cpu());
  static Tensor arange(int64_t end, DType dtype = DType::i64, Device device = Device::cpu()) {
    return arange(0, static_cast<double>(end), 1, dtype, device);
  }
  // Normal(mean, std) and Uniform[low, high) from the generator's next counters.
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu(),
                      double mean = 0, double std = 1);
  static Tensor uniform(const Shape& shape, Generator& gen, double low = 0, double high = 1,
                        DType dtype = DType::f32, Device device = Device::cpu());
  // Copies host values (T's dtype) into a new tensor on `device`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());
  // Borrows memory that the caller keeps alive through `keep_alive` (may be null: caller's promise).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                          std::shared_ptr<void> keep_alive = nullptr);

  // ---- metadata ----
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  int dim() const { return shape_.size(); }
  int64_t numel() const { return shape_.numel(); }
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage_with(const Tensor& other) const { return defined() && storage_ == other.storage_; }
  // Address of the first element (storage data + offset); a device address for CUDA tensors.
  void* data_ptr() const;
  // Typed data_ptr; throws DTypeError when T is not this tensor's dtype.
  template <typename T> T* data() const;

  // ---- views: share storage, never copy ----
  Tensor view(const Shape& shape) const;     // one -1 is inferred; throws when strides do not allow it
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a contiguous copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a rank-2 tensor
  Tensor permute(const Dims& order) const;
  // Python-style [start:end:step] on one dim: negative indices count from the end, bounds are clamped.
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;  // strict bounds
  Tensor select(int64_t dim, int64_t index) const;                  // removes the dim
  Tensor expand(const Shape& shape) const;  // broadcast: size-1 dims get stride 0; -1 keeps a size
  Tensor broadcast_to(const Shape& shape) const { return expand(shape); }
  Tensor squeeze() const;  // all size-1 dims
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;

  // ---- copies ----
  Tensor contiguous() const;  // this tensor when already contiguous
  Tensor clone() const;       // always a new contiguous tensor
  Tensor to(Device device) const;  // this tensor when already there
  Tensor to(DType dtype) const;    // this tensor when already that dtype
  Tensor to(Device device, DType dtype) const;
  // Copies `src` into this tensor in place: src broadcasts to this shape; dtype and device may differ.
  void copy_(const Tensor& src);

  // ---- host access (copies from the device when needed) ----
  template <typename T> T item() const;                // the single element of a one-element tensor
  template <typename T> std::vector<T> to_vector() const;  // all elements in row-major order
  std::string str() const;  // readable, truncated for large tensors

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// ---- template definitions ----
template <typename T>
T* Tensor::data() const {
  MICROLLM_CHECK(dtype_of<T>() == dtype_, DTypeError, "data", "requested ", dtype_of<T>(),
                 " pointer from a tensor of dtype ", dtype_);
  return static_cast<T*>(data_ptr());
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  MICROLLM_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), ShapeError, "from_vector", values.size(),
                 " values do not fill shape ", shape);
  auto keep = std::make_shared<std::vector<T>>(values);
  Tensor host = from_blob(keep->data(), shape, dtype_of<T>(), Device::cpu(), keep);
  return device.is_cpu() ? host.clone() : host.to(device);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = to(Device::cpu(), dtype_of<T>()).contiguous();
  const T* begin = static_cast<const T*>(host.data_ptr());
  return std::vector<T>(begin, begin + host.numel());
}

template <typename T>
T Tensor::item() const {
  MICROLLM_CHECK(numel() == 1, ShapeError, "item", "tensor of shape ", shape_, " has ", numel(),
                 " elements, not 1");
  return to_vector<T>()[0];
}

}  // namespace microllm
