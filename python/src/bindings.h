// The pieces of the extension module microllm._microllm, one function per file, called in this order by
// module.cpp: each registers its classes and functions on the module (or a submodule) it is given.
#pragma once

#include <pybind11/pybind11.h>

namespace microllm::python {

namespace py = pybind11;

void bind_errors(py::module_& m);   // module.cpp: microllm.Error and its subclasses
void bind_tensor(py::module_& m);   // tensor.cpp: Tensor, dtypes, devices, NumPy and DLPack
void bind_ops(py::module_& m);      // ops.cpp: microllm.ops
void bind_models(py::module_& m);   // models.cpp: load_model, Model, Tokenizer, generation, LLM
void bind_train(py::module_& m);    // train.cpp: train(), autograd Variables

}  // namespace microllm::python
