// Tensor metadata and views. Nothing here touches element values.
#include "microllm/core/tensor.h"

#include <algorithm>
#include <optional>

namespace microllm {

Tensor::Tensor(std::shared_ptr<Storage> storage, const Shape& shape, const Strides& strides, int64_t offset,
               DType dtype)
    : storage_(std::move(storage)), shape_(shape), strides_(strides), offset_(offset), dtype_(dtype) {
  MICROLLM_CHECK(storage_ != nullptr, ValueError, "tensor", "storage is null");
  MICROLLM_CHECK(shape.size() == strides.size(), ShapeError, "tensor", "shape ", shape, " and strides ", strides,
                 " differ in rank");
  MICROLLM_CHECK(offset >= 0, ValueError, "tensor", "negative offset ", offset);
  const int64_t count = shape.numel();
  if (count == 0) return;
  int64_t last = offset;  // the highest element index any view position reaches
  for (int d = 0; d < shape.size(); ++d) {
    MICROLLM_CHECK(strides[d] >= 0, ValueError, "tensor", "negative stride in ", strides);
    last += (shape[d] - 1) * strides[d];
  }
  const auto needed = static_cast<size_t>(last + 1) * dtype_size(dtype);
  MICROLLM_CHECK(needed <= storage_->nbytes(), ValueError, "tensor", "shape ", shape, " strides ", strides,
                 " offset ", offset, " reach byte ", needed, " of a storage of ", storage_->nbytes(), " bytes");
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

int64_t Tensor::size(int64_t dim) const { return shape_[normalize_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const { return strides_[normalize_dim(dim, this->dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // whatever the strides: a size-0 dim anywhere, not only after the mismatch
  int64_t expected = 1;
  for (int d = dim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  MICROLLM_CHECK(defined(), ValueError, "data_ptr", "tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

namespace {

// Replaces one -1 with the size that keeps numel; checks the element counts match.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape shape = requested;
  int inferred = -1;
  int64_t known = 1;
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      MICROLLM_CHECK(inferred < 0, ShapeError, op, "only one dim may be -1 in ", requested);
      inferred = d;
    } else {
      MICROLLM_CHECK(shape[d] >= 0, ShapeError, op, "invalid size ", shape[d], " in ", requested);
      known *= shape[d];
    }
  }
  if (inferred >= 0) {
    MICROLLM_CHECK(known != 0 && numel % known == 0, ShapeError, op, "shape ", requested,
                   " is invalid for a tensor of ", numel, " elements");
    shape[inferred] = numel / known;
  }
  MICROLLM_CHECK(shape.numel() == numel, ShapeError, op, "shape ", requested, " is invalid for a tensor of ", numel,
                 " elements");
  return shape;
}

// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), or nothing.
// The same chunk-matching rule as PyTorch's computeStride.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape) {
  if (old_shape.numel() <= 1 || old_shape.size() == 0) return contiguous_strides(new_shape);
  Strides new_strides = new_shape;
  int view_d = new_shape.size() - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int tensor_d = old_shape.size() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    const bool chunk_ends = tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                                              old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = old_strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "view");
  const auto strides = view_strides(shape_, strides_, target);
  MICROLLM_CHECK(strides.has_value(), ShapeError, "view", "cannot view shape ", shape_, " with strides ", strides_,
                 " as ", target, "; use reshape(), which copies");
  return Tensor(storage_, target, *strides, offset_, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "reshape");
  if (const auto strides = view_strides(shape_, strides_, target)) return Tensor(storage_, target, *strides, offset_, dtype_);
  return contiguous().view(target);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int start = normalize_dim(start_dim, dim(), "flatten");
  const int end = normalize_dim(end_dim, dim(), "flatten");
  MICROLLM_CHECK(start <= end, IndexError, "flatten", "start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape shape;
  for (int d = 0; d < start; ++d) shape.push_back(shape_[d]);
  int64_t merged = 1;
  for (int d = start; d <= end; ++d) merged *= shape_[d];
  shape.push_back(merged);
  for (int d = end + 1; d < dim(); ++d) shape.push_back(shape_[d]);
  return reshape(shape);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int a = normalize_dim(dim0, dim(), "transpose");
  const int b = normalize_dim(dim1, dim(), "transpose");
  Shape shape = shape_;
  Strides strides = strides_;
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::t() const {
  MICROLLM_CHECK(dim() == 2, ShapeError, "t", "expects a rank-2 tensor, got shape ", shape_);
  return transpose(0, 1);
}

Tensor Tensor::permute(const Dims& order) const {
  MICROLLM_CHECK(order.size() == dim(), ShapeError, "permute", "order ", order, " does not match rank ", dim());
  Shape shape;
  Strides strides;
  bool seen[kMaxDims] = {};
  for (int i = 0; i < order.size(); ++i) {
    const int d = normalize_dim(order[i], dim(), "permute");
    MICROLLM_CHECK(!seen[d], ShapeError, "permute", "order ", order, " repeats dim ", d);
    seen[d] = true;
    shape.push_back(shape_[d]);
    strides.push_back(strides_[d]);
  }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  const int d = normalize_dim(dim, this->dim(), "slice");
  MICROLLM_CHECK(step > 0, ValueError, "slice", "step must be positive, got ", step);
  const int64_t size = shape_[d];
  auto clamp_index = [size](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + size : i, 0, size); };
  const int64_t lo = clamp_index(start);
  const int64_t hi = std::max(lo, clamp_index(end));
  Shape shape = shape_;
  Strides strides = strides_;
  shape[d] = (hi - lo + step - 1) / step;
  strides[d] = strides_[d] * step;
  return Tensor(storage_, shape, strides, offset_ + (shape[d] > 0 ? lo * strides_[d] : 0), dtype_);
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int d = normalize_dim(dim, this->dim(), "narrow");
  const int64_t first = start < 0 ? start + shape_[d] : start;
  MICROLLM_CHECK(first >= 0 && length >= 0 && first + length <= shape_[d], IndexError, "narrow", "start ", start,
                 " length ", length, " is out of range for dim ", d, " of shape ", shape_);
  Shape shape = shape_;
  shape[d] = length;
  return Tensor(storage_, shape, strides_, offset_ + first * strides_[d], dtype_);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const int d = normalize_dim(dim, this->dim(), "select");
  const int64_t i = index < 0 ? index + shape_[d] : index;
  MICROLLM_CHECK(i >= 0 && i < shape_[d], IndexError, "select", "index ", index, " is out of range for dim ", d,
                 " of shape ", shape_);
  Shape shape = shape_;
  Strides strides = strides_;
  shape.erase(d);
  strides.erase(d);
  return Tensor(storage_, shape, strides, offset_ + i * strides_[d], dtype_);
}

Tensor Tensor::expand(const Shape& target) const {
  MICROLLM_CHECK(target.size() >= dim(), ShapeError, "expand", "cannot expand shape ", shape_, " to fewer dims ",
                 target);
  Shape shape;
  Strides strides;
  const int lead = target.size() - dim();
  for (int d = 0; d < target.size(); ++d) {
    if (d < lead) {
      MICROLLM_CHECK(target[d] >= 0, ShapeError, "expand", "invalid size ", target[d], " in ", target);
      shape.push_back(target[d]);
      strides.push_back(0);
      continue;
    }
    const int64_t have = shape_[d - lead];
    const int64_t want = target[d] == -1 ? have : target[d];
    MICROLLM_CHECK(have == want || have == 1, ShapeError, "expand", "cannot expand shape ", shape_, " to ", target,
                   " (dim ", d, ": ", have, " vs ", want, ")");
    shape.push_back(want);
    strides.push_back(have == want ? strides_[d - lead] : 0);
  }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::squeeze() const {
  Shape shape;
  Strides strides;
  for (int d = 0; d < dim(); ++d) {
    if (shape_[d] == 1) continue;
    shape.push_back(shape_[d]);
    strides.push_back(strides_[d]);
  }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int d = normalize_dim(dim, this->dim(), "squeeze");
  if (shape_[d] != 1) return *this;
  Shape shape = shape_;
  Strides strides = strides_;
  shape.erase(d);
  strides.erase(d);
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int d = normalize_dim(dim, this->dim() + 1, "unsqueeze");
  Shape shape = shape_;
  Strides strides = strides_;
  const int64_t stride = d < this->dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(d, 1);
  strides.insert(d, stride);
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

}  // namespace microllm
