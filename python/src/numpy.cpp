// NumPy interop without copies, both ways.
//
// microLLM -> NumPy: CPU tensors of the dtypes NumPy has (f32 f64 f16 i8 u8 i32 i64) export the buffer protocol and
// __array__ with their strides in bytes, so np.asarray(t) of a transpose or a slice is a view of the same memory.
// bf16 and the fp8 types have no NumPy dtype and CUDA memory is not host memory: both are refused with a message that
// names the way out (DLPack for torch, or an explicit .to(...)). The buffer protocol is installed by hand rather than
// through def_buffer: pybind11 2.10 lets an exception thrown there escape into the interpreter's C code, and a
// refusal must become a BufferError.
//
// NumPy -> microLLM: from_numpy(a) (and tensor(a)) wrap the array's memory in a Storage whose keep-alive holds a
// reference to the array. An array is shared when it is writable (microLLM tensors have no read-only flag), aligned,
// in native byte order, of a microLLM dtype, of rank <= 8 and with strides that are non-negative multiples of its
// item size (a[::-1] is not); from_numpy refuses the others, tensor() copies them.
#include <pybind11/numpy.h>

#include <string>
#include <vector>

#include "microllm/core/storage.h"
#include "tensor_interop.h"

namespace microllm::python {

const char* numpy_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::f64: return "float64";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    default: return nullptr;
  }
}

namespace {

// PEP 3118 format characters of the same types.
const char* buffer_format(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f";
    case DType::f16: return "e";
    case DType::f64: return "d";
    case DType::i8: return "b";
    case DType::u8: return "B";
    case DType::i32: return "i";
    case DType::i64: return sizeof(long) == 8 ? "l" : "q";
    default: return nullptr;
  }
}

void require_numpy_can_view(const Tensor& t, const char* where) {
  MICROLLM_CHECK(t.device().is_cpu(), DeviceError, where, "the tensor is on ", t.device(),
                 " and NumPy reads host memory: copy it with t.to(\"cpu\") first, or share it with torch through "
                 "DLPack (torch.from_dlpack(t))");
  MICROLLM_CHECK(numpy_dtype_name(t.dtype()) != nullptr, DTypeError, where, t.dtype(),
                 " has no NumPy dtype: share it through DLPack (torch.from_dlpack(t)), or convert it first with "
                 "t.to(dtype=\"f32\")");
}

std::vector<py::ssize_t> byte_strides(const Tensor& t) {
  std::vector<py::ssize_t> strides;
  for (const int64_t stride : t.strides()) strides.push_back(stride * static_cast<int64_t>(t.element_size()));
  return strides;
}

// An ndarray over the tensor's memory; `owner` (the Python tensor) becomes its base and keeps the storage alive.
py::array numpy_view(const Tensor& t, py::handle owner) {
  const std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  return py::array(py::dtype::from_args(py::str(numpy_dtype_name(t.dtype()))), shape, byte_strides(t), t.data_ptr(),
                   owner);
}

bool is_f_contiguous(const Tensor& t) {
  if (t.numel() == 0) return true;
  int64_t expected = 1;
  for (int d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

struct BufferLayout {
  std::vector<Py_ssize_t> shape, strides;
};

int tensor_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  view->obj = nullptr;
  try {
    const Tensor& t = py::handle(self).cast<const Tensor&>();
    require_numpy_can_view(t, "buffer");
    const bool with_strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
    const bool c_contiguous = t.is_contiguous(), f_contiguous = is_f_contiguous(t);
    MICROLLM_CHECK(with_strides || c_contiguous, ValueError, "buffer",
                   "the consumer asked for contiguous memory and the tensor is a strided view: use t.contiguous()");
    MICROLLM_CHECK((flags & PyBUF_C_CONTIGUOUS) != PyBUF_C_CONTIGUOUS || c_contiguous, ValueError, "buffer",
                   "C-contiguous memory was asked for: use t.contiguous()");
    MICROLLM_CHECK((flags & PyBUF_F_CONTIGUOUS) != PyBUF_F_CONTIGUOUS || f_contiguous, ValueError, "buffer",
                   "Fortran-contiguous memory was asked for and the tensor is not");
    MICROLLM_CHECK((flags & PyBUF_ANY_CONTIGUOUS) != PyBUF_ANY_CONTIGUOUS || c_contiguous || f_contiguous,
                   ValueError, "buffer", "contiguous memory was asked for: use t.contiguous()");
    auto* layout = new BufferLayout{{t.shape().begin(), t.shape().end()}, {}};
    for (const py::ssize_t stride : byte_strides(t)) layout->strides.push_back(stride);
    view->buf = t.data_ptr();
    view->len = static_cast<Py_ssize_t>(t.nbytes());
    view->readonly = 0;
    view->itemsize = static_cast<Py_ssize_t>(t.element_size());
    view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? const_cast<char*>(buffer_format(t.dtype())) : nullptr;
    view->ndim = t.dim();
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? layout->shape.data() : nullptr;
    view->strides = with_strides ? layout->strides.data() : nullptr;
    view->suboffsets = nullptr;
    view->internal = layout;
    view->obj = py::handle(self).inc_ref().ptr();
    return 0;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
  }
  return -1;
}

void tensor_releasebuffer(PyObject* /*self*/, Py_buffer* view) { delete static_cast<BufferLayout*>(view->internal); }

bool copy_required(const py::object& copy) { return !copy.is_none() && copy.cast<bool>(); }
bool copy_forbidden(const py::object& copy) { return !copy.is_none() && !copy.cast<bool>(); }

// Tensor.__array__(dtype=None, copy=None), as NumPy 1.x (dtype only) and 2.x (copy too) call it. copy=False raises
// ValueError where a copy is needed (a dtype change), as NumPy 2 asks.
py::object tensor_array(const py::object& self, const py::object& dtype, const py::object& copy) {
  const Tensor& t = self.cast<const Tensor&>();
  if (numpy_dtype_name(t.dtype()) == nullptr && t.device().is_cpu() && !dtype.is_none()) {
    // bf16 and fp8 to an explicit NumPy dtype: a conversion, so a copy.
    if (copy_forbidden(copy)) throw py::value_error(str_cat("[__array__] copy=False, but ", t.dtype(), " to ",
                                                            std::string(py::str(dtype)), " is a conversion"));
    const DType target = dtype_from_python(dtype);
    Tensor converted;
    {
      py::gil_scoped_release release;
      converted = t.to(target);
    }
    require_numpy_can_view(converted, "__array__");
    const py::object owner = py::cast(std::move(converted));
    return numpy_view(owner.cast<const Tensor&>(), owner);
  }
  require_numpy_can_view(t, "__array__");
  py::array view = numpy_view(t, self);
  if (!dtype.is_none()) {
    const py::object wanted = py::module_::import("numpy").attr("dtype")(dtype);
    if (!wanted.equal(view.dtype())) {
      if (copy_forbidden(copy)) throw py::value_error(str_cat("[__array__] copy=False, but ", t.dtype(), " to ",
                                                              std::string(py::str(wanted)), " is a conversion"));
      return view.attr("astype")(wanted);
    }
  }
  if (copy_required(copy)) return view.attr("copy")();
  return std::move(view);
}

// The microLLM dtype of a NumPy dtype in native byte order, if there is one.
std::optional<DType> dtype_of_numpy(const py::dtype& dtype) {
  if (!dtype.attr("isnative").cast<bool>()) return std::nullopt;
  const char kind = dtype.kind();
  const auto size = dtype.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'i' && size == 1) return DType::i8;
  if (kind == 'u' && size == 1) return DType::u8;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  return std::nullopt;
}

// Why the array's layout cannot be shared, or empty when it can (the dtype is checked apart).
std::string layout_obstacle(const py::array& array) {
  if (array.ndim() > kMaxDims) return str_cat("its rank ", array.ndim(), " exceeds microLLM's ", kMaxDims, " dims");
  if (!array.writeable()) return "it is read-only (microLLM tensors are writable)";
  if (array.size() == 0) return {};
  if (!(array.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) return "its data is not aligned to its item size";
  for (py::ssize_t d = 0; d < array.ndim(); ++d) {
    if (array.shape(d) <= 1) continue;  // the stride of a dim of size 1 is never used
    const py::ssize_t stride = array.strides(d);
    if (stride < 0) return str_cat("its stride ", stride, " bytes in dim ", d, " is negative (a reversed view)");
    if (stride % array.itemsize() != 0)
      return str_cat("its stride ", stride, " bytes in dim ", d, " is not a multiple of its item size ",
                     array.itemsize());
  }
  return {};
}

// A tensor over the array's memory (layout_obstacle is empty, `dtype` is the array's).
Tensor share_array(const py::array& array, DType dtype) {
  Shape shape;
  for (py::ssize_t d = 0; d < array.ndim(); ++d) shape.push_back(array.shape(d));
  Strides strides = contiguous_strides(shape);  // kept for dims of size <= 1, whose NumPy stride is arbitrary
  int64_t last = 0;                             // the highest element index the array reaches
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 1) continue;
    strides[d] = array.strides(d) / array.itemsize();
    last += (shape[d] - 1) * strides[d];
  }
  const size_t nbytes = shape.numel() == 0 ? 0 : static_cast<size_t>(last + 1) * static_cast<size_t>(array.itemsize());
  auto storage = Storage::wrap(const_cast<void*>(array.data()), nbytes, Device::cpu(), hold_python_object(array));
  return Tensor(std::move(storage), shape, strides, 0, dtype);
}

}  // namespace

Tensor tensor_from_numpy(const py::object& source, std::optional<DType> dtype, std::optional<Device> device,
                         std::optional<bool> copy, const char* where) {
  const auto array = py::reinterpret_borrow<py::array>(source);
  const std::optional<DType> source_dtype = dtype_of_numpy(array.dtype());
  const std::string numpy_name = py::str(array.dtype());
  if (!dtype && !source_dtype) {
    // A copy in the nearest microLLM dtype: bool as u8 (the comparisons' dtype), a swapped byte order as native.
    if (array.dtype().kind() == 'b') dtype = DType::u8;
    else dtype = dtype_of_numpy(py::dtype(array.dtype().attr("newbyteorder")("=")));
    MICROLLM_CHECK(dtype.has_value(), DTypeError, where, "NumPy dtype ", numpy_name,
                   " has no microLLM dtype (f32 f16 f64 i8 u8 i32 i64 are shared): pass dtype= to convert it");
  }
  const DType target = dtype.value_or(source_dtype.value_or(DType::u8));
  const Device target_device = device.value_or(Device::cpu());
  std::string obstacle;
  if (source_dtype != target) obstacle = str_cat("its dtype ", numpy_name, " is not ", target);
  else if (!target_device.is_cpu()) obstacle = str_cat("the tensor is to live on ", target_device);
  else obstacle = layout_obstacle(array);
  if (obstacle.empty() && copy != true) return share_array(array, target);
  MICROLLM_CHECK(copy != false, ValueError, where, "cannot share the array's memory without a copy: ", obstacle,
                 std::string_view(where) == "from_numpy" ? " (microllm.tensor(array) copies)" : "");
  // The copy: NumPy makes a C-contiguous array of the target dtype where NumPy has it (else of the source's dtype, or
  // f64), and the library converts it once to bf16 or fp8 and moves it to the device.
  const char* staging_dtype = numpy_dtype_name(target);
  if (!staging_dtype) staging_dtype = source_dtype ? numpy_dtype_name(*source_dtype) : "float64";
  const py::array staging = py::module_::import("numpy").attr("array")(array, py::arg("dtype") = staging_dtype,
                                                                       py::arg("order") = "C");
  const Tensor host = share_array(staging, *dtype_of_numpy(staging.dtype()));
  py::gil_scoped_release release;
  return host.to(target_device, target);
}

void bind_numpy(py::module_& m, py::class_<Tensor>& tensor) {
  auto* heap_type = reinterpret_cast<PyHeapTypeObject*>(tensor.ptr());
  heap_type->as_buffer.bf_getbuffer = tensor_getbuffer;
  heap_type->as_buffer.bf_releasebuffer = tensor_releasebuffer;

  tensor.def("__array__", &tensor_array, py::arg("dtype") = py::none(), py::arg("copy") = py::none(),
             "The tensor as an ndarray over the same memory (CPU, NumPy dtypes); a dtype that differs converts, "
             "a copy (refused with copy=False). bf16 and fp8 tensors convert only to an explicit dtype.");
  tensor.def("numpy", [](const py::object& self) { return tensor_array(self, py::none(), py::bool_(false)); },
             "np.asarray(t): an ndarray sharing this CPU tensor's memory (NumPy dtypes only)");
  m.def("from_numpy", [](const py::object& array) {
    if (!py::isinstance<py::array>(array))
      throw py::type_error("from_numpy expects a numpy.ndarray, not " + std::string(py::str(py::type::of(array))));
    return tensor_from_numpy(array, std::nullopt, std::nullopt, false, "from_numpy");
  }, py::arg("array"), R"doc(
A CPU tensor over the ndarray's memory, never a copy: writes through either side show on the other, and the tensor
(and its views) keep the array alive. Raises microllm.ValueError for arrays it cannot share: read-only, unaligned,
negative strides (a[::-1]) or strides that are not a multiple of the item size, rank > 8, non-native byte order;
microllm.DTypeError for dtypes microLLM lacks (bool, uint16, complex, ...). microllm.tensor(array) copies those.)doc");
}

}  // namespace microllm::python
