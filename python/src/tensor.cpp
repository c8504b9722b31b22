// microllm.Tensor: the library's tensor in Python (to be completed: NumPy buffer protocol, DLPack).
#include "bindings.h"
#include "microllm/core/tensor.h"

namespace microllm::python {

void bind_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor")
      .def_property_readonly("shape", [](const Tensor& t) {
        py::tuple shape(t.dim());
        for (int d = 0; d < t.dim(); ++d) shape[d] = t.size(d);
        return shape;
      })
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); });
}

}  // namespace microllm::python
