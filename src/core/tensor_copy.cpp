// Copies between layouts, dtypes and devices: copy_, contiguous, clone, to.
#include <cstring>

#include "device_runtime.h"
#include "element.h"
#include "microllm/core/tensor.h"
#include "strided_loop.h"

namespace microllm {
namespace {

// dst = convert(src) on the host; src is already expanded to dst's shape.
void cpu_copy_strided(const Tensor& src, const Tensor& dst) {
  const auto* src_base = static_cast<const char*>(src.data_ptr());
  auto* dst_base = static_cast<char*>(dst.data_ptr());
  const std::array<Strides, 2> strides{dst.strides(), src.strides()};
  if (src.dtype() == dst.dtype()) {
    const auto size = static_cast<int64_t>(dst.element_size());
    detail::for_each_row<2>(dst.shape(), strides, [&](const auto& off, int64_t n, const auto& step) {
      char* d = dst_base + off[0] * size;
      const char* s = src_base + off[1] * size;
      if (step[0] == 1 && step[1] == 1) {
        std::memcpy(d, s, static_cast<size_t>(n * size));
        return;
      }
      for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * step[0] * size, s + i * step[1] * size, size);
    });
    return;
  }
  detail::visit_dtype(dst.dtype(), [&]<typename D>() {
    detail::visit_dtype(src.dtype(), [&]<typename S>() {
      D* d_ptr = reinterpret_cast<D*>(dst_base);
      const S* s_ptr = reinterpret_cast<const S*>(src_base);
      detail::for_each_row<2>(dst.shape(), strides, [&](const auto& off, int64_t n, const auto& step) {
        D* d = d_ptr + off[0];
        const S* s = s_ptr + off[1];
        for (int64_t i = 0; i < n; ++i) d[i * step[0]] = detail::convert_element<D>(s[i * step[1]]);
      });
    });
  });
}

}  // namespace

void Tensor::copy_(const Tensor& src) {
  MICROLLM_CHECK(defined() && src.defined(), ValueError, "copy_", "undefined tensor");
  for (int d = 0; d < dim(); ++d) {
    MICROLLM_CHECK(strides_[d] != 0 || shape_[d] <= 1, ValueError, "copy_", "destination shape ", shape_,
                   " strides ", strides_, " is a broadcast view: one element would be written many times");
  }
  const Tensor expanded = src.expand(shape_);
  if (numel() == 0) return;
  if (src.device() == device()) {
    if (device().is_cpu()) cpu_copy_strided(expanded, *this);
    else detail::cuda_copy_strided(expanded, *this);
    return;
  }
  // Across devices: convert and pack on the source device, move the bytes, then place them.
  const Tensor packed = src.to(dtype_).contiguous();
  if (packed.numel() == numel() && is_contiguous()) {
    detail::cuda_copy_bytes(data_ptr(), device(), packed.data_ptr(), packed.device(), nbytes());
    return;
  }
  const Tensor staged = packed.to(device());
  copy_(staged);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  const Tensor packed = contiguous();
  Tensor out = empty(shape_, dtype_, device);
  if (numel() > 0) detail::cuda_copy_bytes(out.data_ptr(), device, packed.data_ptr(), packed.device(), nbytes());
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device, DType dtype) const {
  // Convert where the data is smaller: before a move if the new dtype is narrower, after otherwise.
  if (dtype_size(dtype) <= element_size()) return to(dtype).to(device);
  return to(device).to(dtype);
}

}  // namespace microllm
