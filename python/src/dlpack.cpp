// DLPack (0.6, the legacy unversioned DLManagedTensor in a capsule named "dltensor"): tensors shared with torch,
// NumPy, CuPy and JAX without copies, on the CPU and on CUDA, bf16 included.
//
// Export (Tensor.__dlpack__): the capsule's DLManagedTensor owns a copy of the Tensor (so of its storage) until the
// consumer calls its deleter; a capsule nobody consumed calls it when it is collected. Import (from_dlpack): the
// capsule is renamed "used_dltensor" and the producer's deleter runs exactly once, when the last microLLM tensor
// over the memory dies (with the GIL held: NumPy's deleter drops a Python reference).
//
// CUDA streams, per the array API: the consumer passes the stream it will use (an int cudaStream_t; 1 the legacy
// default stream, 2 the per-thread default one, None the legacy default, -1 no synchronization). The producer makes
// that stream wait, through an event, for the work queued on its own stream: for microLLM, the thread's current
// stream of the tensor's device (cuda::current_stream). Importing, microLLM passes its current stream.
#include <dlpack/dlpack.h>

#include <string>
#include <vector>

#include "microllm/core/storage.h"
#include "tensor_interop.h"

#ifdef MICROLLM_WITH_CUDA
#include <cuda_runtime.h>

#include "microllm/core/cuda.h"
#endif

namespace microllm::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kVersionedCapsuleName = "dltensor_versioned";

DLDataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f64: return {kDLFloat, 64, 1};
    case DType::i8: return {kDLInt, 8, 1};
    case DType::u8: return {kDLUInt, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    default:
      throw DTypeError("__dlpack__", str_cat(dtype, " has no DLPack 0.6 type code: convert it first, e.g. "
                                                    "t.to(dtype=\"bf16\")"));
  }
}

DType dtype_from_dl(const DLDataType& type) {
  if (type.lanes == 1) {
    if (type.code == kDLFloat && type.bits == 32) return DType::f32;
    if (type.code == kDLFloat && type.bits == 16) return DType::f16;
    if (type.code == kDLBfloat && type.bits == 16) return DType::bf16;
    if (type.code == kDLFloat && type.bits == 64) return DType::f64;
    if (type.code == kDLInt && type.bits == 8) return DType::i8;
    if (type.code == kDLUInt && type.bits == 8) return DType::u8;
    if (type.code == kDLInt && type.bits == 32) return DType::i32;
    if (type.code == kDLInt && type.bits == 64) return DType::i64;
  }
  throw DTypeError("from_dlpack", str_cat("DLPack dtype (code ", int{type.code}, ", bits ", int{type.bits},
                                          ", lanes ", type.lanes, ") has no microLLM dtype (f32 f16 bf16 f64 i8 u8 "
                                          "i32 i64; bool is code 6): convert it on the producer's side"));
}

DLDevice dl_device(Device device) {
  return device.is_cpu() ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, device.index};
}

Device device_from_dl(const DLDevice& device) {
  // Pinned host memory (kDLCUDAHost) is host memory the CPU addresses directly.
  if (device.device_type == kDLCPU || device.device_type == kDLCUDAHost) return Device::cpu();
  if (device.device_type == kDLCUDA) {
#ifdef MICROLLM_WITH_CUDA
    return Device::cuda(device.device_id);
#else
    throw NotSupportedError("from_dlpack", "a CUDA tensor, and this microLLM build has no CUDA");
#endif
  }
  throw DeviceError("from_dlpack", str_cat("DLPack device type ", int{device.device_type},
                                           " is not supported (CPU = 1, CUDA = 2, CUDA host = 3)"));
}

// What an exported capsule owns: the tensor (so its storage) and the arrays its DLTensor points into.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

// The destructor of capsules microLLM made: frees the export unless a consumer took it (renamed the capsule).
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // a capsule may die while an exception is pending
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed == nullptr) PyErr_WriteUnraisable(capsule);
  else if (managed->deleter) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

#ifdef MICROLLM_WITH_CUDA
void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw BackendError("dlpack", str_cat(call, ": ", cudaGetErrorString(status)));
}

// Makes `consumer` wait for the work queued so far on this thread's current stream of `device`.
void order_after_current_stream(int device, cudaStream_t consumer) {
  const auto producer = static_cast<cudaStream_t>(cuda::current_stream(device).handle());
  if (producer == consumer || (producer == nullptr && consumer == cudaStreamLegacy)) return;
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaEvent_t event = nullptr;
  cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (status == cudaSuccess) status = cudaEventRecord(event, producer);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(consumer, event, 0);
  if (event != nullptr) (void)cudaEventDestroy(event);  // released once the wait has passed it
  (void)cudaSetDevice(previous);
  check_cuda(status, "recording the export's event");
}

// The array API's stream number of this thread's current stream on `device`.
int64_t current_stream_number(int device) {
  const void* handle = cuda::current_stream(device).handle();
  return handle == nullptr ? 1 : static_cast<int64_t>(reinterpret_cast<intptr_t>(handle));
}
#endif

py::object tensor_dlpack(const Tensor& t, const py::object& stream, const py::object& /*max_version*/,
                         const py::object& requested_device, const py::object& copy) {
  Tensor exported = t;
  const bool copy_required = !copy.is_none() && copy.cast<bool>();
  const bool copy_forbidden = !copy.is_none() && !copy.cast<bool>();
  if (!requested_device.is_none()) {
    const auto pair = requested_device.cast<std::pair<int, int>>();
    const Device target = device_from_dl(DLDevice{static_cast<DLDeviceType>(pair.first), pair.second});
    if (target != t.device()) {
      if (copy_forbidden) throw py::buffer_error(str_cat("[__dlpack__] copy=False, but the tensor is on ", t.device(),
                                                         " and dl_device asks for ", target));
      py::gil_scoped_release release;
      exported = t.to(target);
    }
  }
  if (copy_required && exported.shares_storage_with(t)) {
    py::gil_scoped_release release;
    exported = t.clone();
  }
  const DLDataType dtype = dl_dtype(exported.dtype());
#ifdef MICROLLM_WITH_CUDA
  if (exported.device().is_cuda()) {
    const int64_t number = stream.is_none() ? 1 : stream.cast<int64_t>();
    MICROLLM_CHECK(number != 0, ValueError, "__dlpack__",
                   "stream 0 is ambiguous for CUDA: pass 1 (the legacy default stream), 2 (per-thread default) or "
                   "the stream's handle");
    if (number != -1) {  // -1: the consumer asked for no synchronization
      const auto consumer = number == 1   ? cudaStreamLegacy
                            : number == 2 ? cudaStreamPerThread
                                          : reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(number));
      order_after_current_stream(exported.device().index, consumer);
    }
  }
#else
  (void)stream;  // CPU memory needs no ordering
#endif
  auto context = std::make_unique<ExportContext>();
  context->tensor = exported;
  context->shape.assign(exported.shape().begin(), exported.shape().end());
  context->strides.assign(exported.strides().begin(), exported.strides().end());
  DLManagedTensor& managed = context->managed;
  managed.dl_tensor.data = exported.numel() == 0 ? nullptr : exported.data_ptr();
  managed.dl_tensor.device = dl_device(exported.device());
  managed.dl_tensor.ndim = exported.dim();
  managed.dl_tensor.dtype = dtype;
  managed.dl_tensor.shape = context->shape.data();
  managed.dl_tensor.strides = context->strides.data();
  managed.dl_tensor.byte_offset = 0;
  managed.manager_ctx = context.get();
  managed.deleter = delete_export;
  PyObject* capsule = PyCapsule_New(&managed, kCapsuleName, capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  (void)context.release();  // owned by the capsule, then by its consumer
  return py::reinterpret_steal<py::object>(capsule);
}

// A tensor over the memory of a "dltensor" capsule, which it consumes.
Tensor tensor_from_capsule(const py::object& capsule) {
  PyObject* raw = capsule.ptr();
  MICROLLM_CHECK(!PyCapsule_IsValid(raw, kUsedCapsuleName), ValueError, "from_dlpack",
                 "the DLPack capsule was consumed already (a capsule is used once)");
  MICROLLM_CHECK(!PyCapsule_IsValid(raw, kVersionedCapsuleName), NotSupportedError, "from_dlpack",
                 "versioned DLPack (1.x) capsules are not supported: call __dlpack__() without max_version");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(raw, kCapsuleName));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& dl = managed->dl_tensor;
  const DType dtype = dtype_from_dl(dl.dtype);
  const Device device = device_from_dl(dl.device);
  MICROLLM_CHECK(dl.ndim >= 0 && dl.ndim <= kMaxDims, ShapeError, "from_dlpack", "rank ", dl.ndim,
                 " exceeds microLLM's ", kMaxDims, " dims");
  Shape shape;
  for (int d = 0; d < dl.ndim; ++d) shape.push_back(dl.shape[d]);
  Strides strides = contiguous_strides(shape);  // DLPack: null strides mean compact row-major
  int64_t last = 0;                             // the highest element index the tensor reaches
  for (int d = 0; d < dl.ndim; ++d) {
    if (shape[d] <= 1) continue;  // the stride of a dim of size 1 is never used
    if (dl.strides != nullptr) strides[d] = dl.strides[d];
    MICROLLM_CHECK(strides[d] >= 0, ValueError, "from_dlpack", "negative stride ", strides[d], " in dim ", d,
                   " (a reversed view): microLLM strides are non-negative; make it contiguous on the producer's side");
    last += (shape[d] - 1) * strides[d];
  }
  const size_t nbytes = shape.numel() == 0 ? 0 : static_cast<size_t>(last + 1) * dtype_size(dtype);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  // From here the capsule's memory is ours: renamed first, so that its destructor leaves it alone and the deleter
  // below runs once (the shared_ptr calls it itself should its control block fail to allocate).
  if (PyCapsule_SetName(raw, kUsedCapsuleName) != 0) throw py::error_already_set();
  std::shared_ptr<void> keep_alive(managed, [](void* pointer) {
    auto* consumed = static_cast<DLManagedTensor*>(pointer);
    if (consumed->deleter == nullptr) return;
    if (!Py_IsInitialized()) return;  // after shutdown the producer's memory is leaked rather than freed
    py::gil_scoped_acquire gil;
    consumed->deleter(consumed);
  });
  return Tensor(Storage::wrap(data, nbytes, device, std::move(keep_alive)), shape, strides, 0, dtype);
}

}  // namespace

Tensor tensor_from_dlpack(const py::object& source) {
  if (PyCapsule_CheckExact(source.ptr())) return tensor_from_capsule(source);
  if (!py::hasattr(source, "__dlpack__"))
    throw py::type_error("from_dlpack expects an object with __dlpack__ (torch, NumPy >= 1.22, CuPy, JAX) or a "
                         "\"dltensor\" capsule, not " + std::string(py::str(py::type::of(source))));
  if (py::hasattr(source, "__dlpack_device__")) {
    const auto device = source.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (device.first == kDLCUDA) {
#ifdef MICROLLM_WITH_CUDA
      return tensor_from_capsule(source.attr("__dlpack__")(py::arg("stream") = current_stream_number(device.second)));
#else
      throw NotSupportedError("from_dlpack", "a CUDA tensor, and this microLLM build has no CUDA");
#endif
    }
  }
  return tensor_from_capsule(source.attr("__dlpack__")());
}

void bind_dlpack(py::module_& m, py::class_<Tensor>& tensor) {
  tensor.def("__dlpack__", &tensor_dlpack, py::kw_only(), py::arg("stream") = py::none(),
             py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
             R"doc(
A DLPack capsule ("dltensor", DLPack 0.6, whatever max_version asks) sharing this tensor's memory; the capsule
keeps the storage alive until its consumer releases it. fp8 tensors have no DLPack 0.6 type and are refused.
stream (CUDA): the consumer's stream (1 legacy default, 2 per-thread default, -1 no synchronization, else a
cudaStream_t as an int), made to wait for the work queued on microLLM's current stream. dl_device: a (type, id) to
export to (a copy, refused with copy=False); copy=True exports a copy.)doc");
  tensor.def("__dlpack_device__", [](const Tensor& t) {
    const DLDevice device = dl_device(t.device());
    return py::make_tuple(static_cast<int>(device.device_type), device.device_id);
  }, "(device_type, device_id): (1, 0) for the CPU (kDLCPU), (2, N) for cuda:N (kDLCUDA)");
  m.def("from_dlpack", &tensor_from_dlpack, py::arg("source"), R"doc(
A tensor over the memory of `source`, never a copy: an object with __dlpack__ (a torch tensor, a NumPy array,
another microllm.Tensor) or a "dltensor" capsule. The producer's memory stays alive until the last microLLM tensor
over it dies; then its deleter runs, once. dtypes f32 f16 bf16 f64 i8 u8 i32 i64; CPU, and CUDA in CUDA builds
(the producer orders its work before microLLM's current stream). Negative strides are refused.)doc");
}

}  // namespace microllm::python
