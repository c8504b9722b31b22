// What the tensor bindings share (tensor.cpp, numpy.cpp, dlpack.cpp, ops.cpp): Python values read as microLLM's
// dtypes, devices and shapes, and the keep-alive that lets a Storage borrow memory a Python object owns.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>

#include "microllm/core/tensor.h"

namespace microllm::python {

namespace py = pybind11;

// A dtype argument: a name parse_dtype knows ("f32", "float32", "bf16", "bfloat16", ...), a NumPy dtype or scalar
// type (np.float32, np.dtype("int64")) or a torch dtype (torch.bfloat16). Throws microllm.ValueError otherwise.
DType dtype_from_python(py::handle value);
// None -> nothing, else dtype_from_python.
std::optional<DType> optional_dtype(py::handle value);
// "cpu", "cuda", "cuda:1", or anything whose str() is one of those (torch.device).
Device device_from_python(py::handle value);
std::optional<Device> optional_device(py::handle value);
// An int (rank 1) or a sequence of ints.
Shape shape_from_python(py::handle value);

// A handle that owns a reference to `object` and drops it with the GIL held, from whichever thread releases the last
// reference to the Storage that holds it (a kernel thread, a DLPack consumer's deleter). After the interpreter has
// shut down the reference is leaked rather than touched.
std::shared_ptr<void> hold_python_object(py::object object);

// The NumPy dtype name of a microLLM dtype ("float32", ...), or nullptr for bf16 and the fp8 types, which NumPy
// lacks.
const char* numpy_dtype_name(DType dtype);

// The pieces of the Tensor class that live in their own files, called by bind_tensor.
void bind_numpy(py::module_& m, py::class_<Tensor>& tensor);   // numpy.cpp: buffer protocol, __array__, from_numpy
void bind_dlpack(py::module_& m, py::class_<Tensor>& tensor);  // dlpack.cpp: __dlpack__, from_dlpack

// microllm.tensor(ndarray, ...): shares `array`'s memory when dtype, device and layout allow and `copy` is not True,
// copies otherwise (copy False: raises ValueError naming `where` and the reason instead). numpy.cpp.
Tensor tensor_from_numpy(const py::object& array, std::optional<DType> dtype, std::optional<Device> device,
                         std::optional<bool> copy, const char* where = "tensor");
// microllm.from_dlpack(obj): shares the memory of an object with __dlpack__ or of a "dltensor" capsule. dlpack.cpp.
Tensor tensor_from_dlpack(const py::object& source);

}  // namespace microllm::python
