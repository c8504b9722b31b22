// microllm.Tensor: the library's Tensor (shared storage + shape + strides in elements + offset + dtype) in Python,
// with its views, copies, host access and the factories. NumPy interop is in numpy.cpp, DLPack in dlpack.cpp.
//
// dtypes are strings: Tensor.dtype is the library's name ("f32", "bf16", "i64", ...), and every dtype argument also
// takes the long spellings ("float32", "bfloat16"), NumPy dtypes and torch dtypes. microllm.float32, .bfloat16, ...
// are those names, so `t.dtype == microllm.bfloat16` reads naturally. Devices are strings too: "cpu", "cuda:0".
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "microllm/core/storage.h"
#include "tensor_interop.h"

namespace microllm::python {

DType dtype_from_python(py::handle value) {
  if (py::isinstance<py::str>(value)) return parse_dtype(value.cast<std::string>());
  const std::string text = py::str(value);
  if (text.starts_with("torch.")) return parse_dtype(text.substr(6));
  try {
    const py::object numpy_dtype = py::module_::import("numpy").attr("dtype")(value);
    return parse_dtype(numpy_dtype.attr("name").cast<std::string>());
  } catch (const py::error_already_set&) {
    throw ValueError("dtype", str_cat("cannot read a dtype from ", std::string(py::repr(value)),
                                      " (expected a name such as \"f32\" or \"bf16\", a NumPy or a torch dtype)"));
  }
}

std::optional<DType> optional_dtype(py::handle value) {
  if (value.is_none()) return std::nullopt;
  return dtype_from_python(value);
}

Device device_from_python(py::handle value) { return Device::parse(py::str(value).cast<std::string>()); }

std::optional<Device> optional_device(py::handle value) {
  if (value.is_none()) return std::nullopt;
  return device_from_python(value);
}

Shape shape_from_python(py::handle value) {
  if (py::isinstance<py::int_>(value)) return Shape{value.cast<int64_t>()};
  return Shape(value.cast<std::vector<int64_t>>());
}

std::shared_ptr<void> hold_python_object(py::object object) {
  return std::shared_ptr<void>(new py::object(std::move(object)), [](void* pointer) {
    auto* held = static_cast<py::object*>(pointer);
    if (!Py_IsInitialized()) {
      (void)held->release();  // the interpreter is gone: nothing may touch the reference count
      delete held;
      return;
    }
    py::gil_scoped_acquire gil;
    delete held;
  });
}

namespace {

// t.view(2, 3) and t.view((2, 3)) alike.
Shape shape_from_args(const py::args& args) {
  if (args.size() == 1 && !py::isinstance<py::int_>(args[0])) return shape_from_python(args[0]);
  return shape_from_python(args);
}

template <typename T>
py::object nested_list(const std::vector<T>& values, const Shape& shape, int dim, size_t& index) {
  if (dim == shape.size()) return py::cast(values[index++]);
  py::list list;
  for (int64_t i = 0; i < shape[dim]; ++i) list.append(nested_list(values, shape, dim + 1, index));
  return list;
}

py::object tensor_tolist(const Tensor& t) {
  size_t index = 0;
  if (is_floating(t.dtype())) return nested_list(t.to_vector<double>(), t.shape(), 0, index);
  return nested_list(t.to_vector<int64_t>(), t.shape(), 0, index);
}

py::object tensor_item(const Tensor& t) {
  if (is_floating(t.dtype())) return py::float_(t.item<double>());
  return py::int_(t.item<int64_t>());
}

// Basic indexing: ints select (removing the dim), slices with a positive step view, None inserts a dim of size 1
// and one Ellipsis stands for the dims not named. Every result is a view. Negative steps have no view (strides are
// non-negative in microLLM): they raise IndexError.
Tensor tensor_getitem(const Tensor& t, const py::object& index) {
  const py::tuple items = py::isinstance<py::tuple>(index) ? py::reinterpret_borrow<py::tuple>(index)
                                                           : py::make_tuple(index);
  int consumed = 0;  // dims of t the index names
  for (const py::handle item : items)
    if (!item.is_none() && !py::isinstance<py::ellipsis>(item)) ++consumed;
  MICROLLM_CHECK(consumed <= t.dim(), IndexError, "getitem", "too many indices (", consumed, ") for a tensor of rank ",
                 t.dim());
  Tensor result = t;
  int dim = 0;  // the dim of `result` the next item applies to
  bool seen_ellipsis = false;
  for (const py::handle item : items) {
    if (py::isinstance<py::ellipsis>(item)) {
      MICROLLM_CHECK(!seen_ellipsis, IndexError, "getitem", "an index can only have a single ellipsis");
      seen_ellipsis = true;
      dim += t.dim() - consumed;
    } else if (item.is_none()) {
      result = result.unsqueeze(dim++);
    } else if (py::isinstance<py::slice>(item)) {
      py::ssize_t start = 0, stop = 0, step = 0, length = 0;
      if (!py::reinterpret_borrow<py::slice>(item).compute(result.size(dim), &start, &stop, &step, &length))
        throw py::error_already_set();
      MICROLLM_CHECK(step > 0, IndexError, "getitem", "slice step ", step,
                     " is not positive: microLLM views have non-negative strides (copy through NumPy to flip)");
      result = result.slice(dim++, start, stop, step);
    } else if (py::isinstance<py::int_>(item) || py::hasattr(item, "__index__")) {
      const auto position = py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr())).cast<int64_t>();
      const int64_t size = result.size(dim);
      MICROLLM_CHECK(position >= -size && position < size, IndexError, "getitem", "index ", position,
                     " is out of range for dim ", dim, " of size ", size);
      result = result.select(dim, position < 0 ? position + size : position);
    } else {
      throw py::type_error("microllm.Tensor indices are ints, slices, None and Ellipsis, not " +
                           std::string(py::str(py::type::of(item))));
    }
  }
  return result;
}

Tensor tensor_to(const Tensor& t, const py::object& device, const py::object& dtype, bool copy) {
  std::optional<Device> target_device;
  std::optional<DType> target_dtype = optional_dtype(dtype);
  // t.to("bf16") as well as t.to("cuda"): a first argument that is no device may be a dtype.
  if (!device.is_none()) {
    try {
      target_device = device_from_python(device);
    } catch (const ValueError&) {
      if (target_dtype) throw;
      target_dtype = dtype_from_python(device);
    }
  }
  py::gil_scoped_release release;
  Tensor result = t.to(target_device.value_or(t.device()), target_dtype.value_or(t.dtype()));
  if (copy && result.shares_storage_with(t)) result = result.clone();
  return result;
}

py::tuple dims_tuple(const Dims& dims) {
  py::tuple tuple(static_cast<size_t>(dims.size()));
  for (int d = 0; d < dims.size(); ++d) tuple[static_cast<size_t>(d)] = dims[d];
  return tuple;
}

Tensor tensor_from_data(const py::object& data, const py::object& dtype, const py::object& device,
                        const py::object& copy) {
  const std::optional<DType> target_dtype = optional_dtype(dtype);
  const std::optional<Device> target_device = optional_device(device);
  const std::optional<bool> copy_rule = copy.is_none() ? std::nullopt : std::optional<bool>(copy.cast<bool>());
  if (py::isinstance<Tensor>(data)) {
    const Tensor& source = data.cast<const Tensor&>();
    py::gil_scoped_release release;
    Tensor result = source.to(target_device.value_or(source.device()), target_dtype.value_or(source.dtype()));
    const bool shared = result.shares_storage_with(source);
    MICROLLM_CHECK(shared || copy_rule != false, ValueError, "tensor",
                   "copy=False, but the conversion to the requested dtype or device copies");
    if (copy_rule == true && shared) result = result.clone();
    return result;
  }
  const py::module_ numpy = py::module_::import("numpy");
  if (py::isinstance(data, numpy.attr("ndarray")))
    return tensor_from_numpy(data, target_dtype, target_device, copy_rule);
  if (py::hasattr(data, "__dlpack__")) {  // a torch tensor, a CuPy array: shared through DLPack
    return tensor_from_data(py::cast(tensor_from_dlpack(data)), dtype, device, copy);
  }
  // Python numbers and (nested) lists: floats default to f32 and bools to u8, as torch.tensor does.
  py::object array = numpy.attr("asarray")(data);
  std::optional<DType> chosen = target_dtype;
  if (!chosen) {
    const auto kind = array.attr("dtype").attr("kind").cast<std::string>();
    if (kind == "f") chosen = DType::f32;
    if (kind == "b") chosen = DType::u8;
  }
  return tensor_from_numpy(array, chosen, target_device, copy_rule);
}

void bind_dtype_names(py::module_& m) {
  const std::pair<const char*, DType> names[] = {
      {"float32", DType::f32}, {"float16", DType::f16}, {"bfloat16", DType::bf16},     {"float64", DType::f64},
      {"int8", DType::i8},     {"uint8", DType::u8},    {"int32", DType::i32},         {"int64", DType::i64},
      {"float8_e4m3fn", DType::f8_e4m3fn},              {"float8_e5m2", DType::f8_e5m2}};
  py::list all;
  for (const auto& [name, dtype] : names) {
    m.attr(name) = dtype_name(dtype);
    all.append(dtype_name(dtype));
  }
  m.attr("dtypes") = py::tuple(all);
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::class_<Tensor> tensor(m, "Tensor", py::buffer_protocol(), R"doc(
A microLLM tensor: shared storage + shape + strides (in elements) + offset + dtype, on "cpu" or "cuda:N".

Views (transpose, slicing, reshape when possible, ...) share storage; copies are explicit (contiguous, clone, to).
dtype is a string ("f32", "bf16", "i64", ...; microllm.float32 etc. name the same strings). NumPy sees CPU tensors
of the dtypes NumPy has without a copy (buffer protocol, __array__); DLPack (__dlpack__) shares any dtype and
device with torch, NumPy and other libraries.)doc");
  tensor.def_property_readonly("shape", [](const Tensor& t) { return dims_tuple(t.shape()); }, "Sizes, a tuple")
      .def_property_readonly("strides", [](const Tensor& t) { return dims_tuple(t.strides()); },
                             "Strides in elements (not bytes, unlike NumPy), a tuple")
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); },
                             "The dtype's name: \"f32\", \"f16\", \"bf16\", \"f64\", \"i8\", \"u8\", \"i32\", \"i64\", "
                             "\"f8e4m3fn\" or \"f8e5m2\"")
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); }, "\"cpu\" or \"cuda:N\"")
      .def_property_readonly("ndim", &Tensor::dim)
      .def_property_readonly("nbytes", &Tensor::nbytes, "numel() * element_size()")
      .def("numel", &Tensor::numel)
      .def("dim", &Tensor::dim)
      .def("size", [](const Tensor& t, const py::object& dim) -> py::object {
        if (dim.is_none()) return dims_tuple(t.shape());
        return py::int_(t.size(dim.cast<int64_t>()));
      }, py::arg("dim") = py::none())
      .def("stride", [](const Tensor& t, const py::object& dim) -> py::object {
        if (dim.is_none()) return dims_tuple(t.strides());
        return py::int_(t.stride(dim.cast<int64_t>()));
      }, py::arg("dim") = py::none(), "Strides in elements")
      .def("element_size", &Tensor::element_size)
      .def("is_contiguous", &Tensor::is_contiguous, "Row-major without gaps")
      .def("storage_offset", &Tensor::offset, "Offset of the first element in its storage, in elements")
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); },
           "Address of the first element (a device address for CUDA tensors)")
      .def("shares_storage_with", &Tensor::shares_storage_with, py::arg("other"))
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) throw py::type_error("len() of a rank-0 tensor");
        return t.size(0);
      })
      .def("__repr__", &Tensor::str)
      .def("__str__", &Tensor::str)
      .def("__getitem__", &tensor_getitem)
      .def("__bool__", [](const Tensor& t) { return tensor_item(t).cast<bool>(); })
      .def("__float__", [](const Tensor& t) { return t.item<double>(); })
      .def("__int__", [](const Tensor& t) { return t.item<int64_t>(); })
      .def("__index__", [](const Tensor& t) {
        if (!is_integral(t.dtype())) throw py::type_error("only integer tensors of one element can be an index");
        return t.item<int64_t>();
      })
      .def("item", &tensor_item, "The one element as a Python float (floating dtypes) or int")
      .def("tolist", &tensor_tolist, "Nested lists of Python floats or ints (a number for rank 0)")
      // ---- copies ----
      .def("to", &tensor_to, py::arg("device") = py::none(), py::arg("dtype") = py::none(), py::arg("copy") = false,
           "A tensor on `device` with `dtype` (either may be omitted; t.to(\"bf16\") and t.to(\"cuda\") work "
           "too). The same storage when nothing changes, unless copy=True.")
      .def("cpu", [](const Tensor& t) {
        py::gil_scoped_release release;
        return t.to(Device::cpu());
      })
      .def("contiguous", [](const Tensor& t) {
        py::gil_scoped_release release;
        return t.contiguous();
      }, "This tensor when already contiguous, else a contiguous copy")
      .def("clone", [](const Tensor& t) {
        py::gil_scoped_release release;
        return t.clone();
      }, "A new contiguous copy")
      .def("copy_", [](Tensor& t, const Tensor& source) -> Tensor& {
        {
          py::gil_scoped_release release;
          t.copy_(source);
        }
        return t;
      }, py::arg("source"), py::return_value_policy::reference_internal,
           "Copies `source` (broadcast; any dtype and device) into this tensor's elements; returns self")
      // ---- views ----
      .def("view", [](const Tensor& t, const py::args& shape) { return t.view(shape_from_args(shape)); },
           "A view with another shape (one -1 is inferred); raises when the strides do not allow it")
      .def("reshape", [](const Tensor& t, const py::args& shape) { return t.reshape(shape_from_args(shape)); },
           "A view when possible, else a contiguous copy")
      .def("flatten", &Tensor::flatten, py::arg("start_dim") = 0, py::arg("end_dim") = -1)
      .def("transpose", &Tensor::transpose, py::arg("dim0"), py::arg("dim1"))
      .def("t", &Tensor::t)
      .def_property_readonly("T", [](const Tensor& t) {
        Dims order;
        for (int d = t.dim() - 1; d >= 0; --d) order.push_back(d);
        return t.permute(order);
      }, "All dims reversed (a view)")
      .def("permute", [](const Tensor& t, const py::args& order) { return t.permute(shape_from_args(order)); })
      .def("slice", &Tensor::slice, py::arg("dim"), py::arg("start"), py::arg("end"), py::arg("step") = 1,
           "[start:end:step] on one dim (Python rules: negative indices count from the end, bounds clamp)")
      .def("narrow", &Tensor::narrow, py::arg("dim"), py::arg("start"), py::arg("length"))
      .def("select", &Tensor::select, py::arg("dim"), py::arg("index"))
      .def("expand", [](const Tensor& t, const py::args& shape) { return t.expand(shape_from_args(shape)); },
           "Broadcast view: size-1 dims get stride 0; -1 keeps a size")
      .def("squeeze", [](const Tensor& t, const py::object& dim) {
        return dim.is_none() ? t.squeeze() : t.squeeze(dim.cast<int64_t>());
      }, py::arg("dim") = py::none())
      .def("unsqueeze", &Tensor::unsqueeze, py::arg("dim"));

  bind_numpy(m, tensor);
  bind_dlpack(m, tensor);
  bind_dtype_names(m);

  // ---- factories ----
  m.def("empty", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return Tensor::empty(shape_from_python(shape), dtype_from_python(dtype), device_from_python(device));
  }, py::arg("shape"), py::arg("dtype") = "f32", py::arg("device") = "cpu",
        "Uninitialized (or 0xFF bytes while set_poison_new_allocations is on)");
  m.def("zeros", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return Tensor::zeros(shape_from_python(shape), dtype_from_python(dtype), device_from_python(device));
  }, py::arg("shape"), py::arg("dtype") = "f32", py::arg("device") = "cpu");
  m.def("ones", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return Tensor::ones(shape_from_python(shape), dtype_from_python(dtype), device_from_python(device));
  }, py::arg("shape"), py::arg("dtype") = "f32", py::arg("device") = "cpu");
  m.def("full", [](const py::object& shape, double fill_value, const py::object& dtype, const py::object& device) {
    return Tensor::full(shape_from_python(shape), fill_value, dtype_from_python(dtype), device_from_python(device));
  }, py::arg("shape"), py::arg("fill_value"), py::arg("dtype") = "f32", py::arg("device") = "cpu");
  m.def("arange", [](const py::object& start, const py::object& end, const py::object& step,
                     const py::object& dtype, const py::object& device) {
    // arange(end) or arange(start, end, step), [start, end); i64 when every bound is an int, else f32.
    const bool integral = py::isinstance<py::int_>(start) && (end.is_none() || py::isinstance<py::int_>(end)) &&
                          py::isinstance<py::int_>(step);
    const double first = end.is_none() ? 0.0 : start.cast<double>();
    const double last = end.is_none() ? start.cast<double>() : end.cast<double>();
    const DType chosen = dtype.is_none() ? (integral ? DType::i64 : DType::f32) : dtype_from_python(dtype);
    return Tensor::arange(first, last, step.cast<double>(), chosen, device_from_python(device));
  }, py::arg("start"), py::arg("end") = py::none(), py::arg("step") = 1, py::arg("dtype") = py::none(),
        py::arg("device") = "cpu", "Like torch.arange: [start, end) in steps of step");
  m.def("tensor", &tensor_from_data, py::arg("data"), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        py::arg("copy") = py::none(), R"doc(
A tensor from a NumPy array, a microllm.Tensor, an object with __dlpack__ (torch), or Python numbers and lists.

copy=None (default) shares the source's memory when its dtype, device and layout allow, else copies; copy=True
always copies; copy=False raises ValueError instead of copying. An ndarray is shared when it is writable, aligned,
in native byte order, of a dtype microLLM has and with non-negative strides that are multiples of its item size;
others (read-only, negative strides (a[::-1]), bool) are copied. Python floats become f32, bools u8, ints i64.)doc");

  // ---- process-wide switches and queries the tests use ----
  m.def("set_poison_new_allocations", &set_poison_new_allocations, py::arg("on"),
        "When on, every new allocation is filled with 0xFF bytes (NaN for floats, -1 for integers), so an element "
        "an op forgot to write shows");
  m.def("poison_new_allocations", &poison_new_allocations);
  m.def("cuda_available", &cuda_available, "Whether this build has CUDA and the machine a CUDA device");
  m.def("cuda_device_count", &cuda_device_count);
}

}  // namespace microllm::python
