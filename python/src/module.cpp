// microllm._microllm: the extension module the Python package `microllm` re-exports (python/microllm/__init__.py).
#include <pybind11/pybind11.h>

#include <string>

#include "bindings.h"
#include "microllm/core/error.h"
#include "microllm/version.h"

namespace microllm::python {

// microllm.Error (a RuntimeError) and one subclass per C++ error class, each also deriving from the Python
// exception a Python user would catch for it (ShapeError is a ValueError, IndexError an IndexError, ...). The
// message is the C++ one, unchanged. Derived classes are registered after their bases, so they are tried first.
void bind_errors(py::module_& m) {
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  auto sub = [&](const char* name, PyObject* python_base) {
    py::tuple bases = py::make_tuple(error, py::handle(python_base));
    return py::reinterpret_steal<py::object>(
        PyErr_NewException(("microllm." + std::string(name)).c_str(), bases.ptr(), nullptr));
  };
  static py::object shape = sub("ShapeError", PyExc_ValueError), dtype = sub("DTypeError", PyExc_TypeError),
                    device = sub("DeviceError", PyExc_RuntimeError), value = sub("ValueError", PyExc_ValueError),
                    index = sub("IndexError", PyExc_IndexError),
                    not_supported = sub("NotSupportedError", PyExc_NotImplementedError),
                    io = sub("IoError", PyExc_OSError), parse = sub("ParseError", PyExc_ValueError),
                    backend = sub("BackendError", PyExc_RuntimeError),
                    out_of_memory = sub("OutOfMemoryError", PyExc_MemoryError);
  m.attr("ShapeError") = shape;
  m.attr("DTypeError") = dtype;
  m.attr("DeviceError") = device;
  m.attr("ValueError") = value;
  m.attr("IndexError") = index;
  m.attr("NotSupportedError") = not_supported;
  m.attr("IoError") = io;
  m.attr("ParseError") = parse;
  m.attr("BackendError") = backend;
  m.attr("OutOfMemoryError") = out_of_memory;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      PyErr_SetString(shape.ptr(), e.what());
    } catch (const DTypeError& e) {
      PyErr_SetString(dtype.ptr(), e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(device.ptr(), e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(value.ptr(), e.what());
    } catch (const IndexError& e) {
      PyErr_SetString(index.ptr(), e.what());
    } catch (const NotSupportedError& e) {
      PyErr_SetString(not_supported.ptr(), e.what());
    } catch (const IoError& e) {
      PyErr_SetString(io.ptr(), e.what());
    } catch (const ParseError& e) {
      PyErr_SetString(parse.ptr(), e.what());
    } catch (const OutOfMemoryError& e) {
      PyErr_SetString(out_of_memory.ptr(), e.what());
    } catch (const BackendError& e) {
      PyErr_SetString(backend.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
}

}  // namespace microllm::python

PYBIND11_MODULE(_microllm, m) {
  namespace mp = microllm::python;
  m.doc() = "microLLM: the C++ runtime's Python bindings (use the package `microllm`)";
  m.attr("__version__") = MICROLLM_VERSION_STRING;
  mp::bind_errors(m);
  mp::bind_tensor(m);
  mp::bind_ops(m);
  mp::bind_models(m);
  mp::bind_train(m);
}
