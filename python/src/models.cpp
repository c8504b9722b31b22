// microllm.load_model and microllm.Model: a Hugging Face folder or a microllm checkpoint loaded as
// `microllm generate` loads it, its config, logits (as `microllm logits` computes them), activation taps and
// attention weights; then the tokenizer, generation and engine bindings (their own files) join the module.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <utility>

#include "microllm/autograd/variable.h"
#include "microllm/core/error.h"
#include "microllm/models/loader.h"
#include "microllm/nn/taps.h"
#include "model_bindings.h"

namespace microllm::python {

std::string text_bytes(py::handle text) {
  if (py::isinstance<py::bytes>(text)) return std::string(py::reinterpret_borrow<py::bytes>(text));
  if (!py::isinstance<py::str>(text)) {
    throw py::type_error("expected str or bytes, got " + std::string(py::str(py::type::handle_of(text))));
  }
  py::object encoded = py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogateescape"));
  if (!encoded) throw py::error_already_set();
  return std::string(py::reinterpret_borrow<py::bytes>(encoded));
}

py::str python_text(const std::string& bytes) {
  PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "surrogateescape");
  if (!text) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

namespace {

std::vector<int64_t> int_row(py::handle row, const char* op, size_t index) {
  std::vector<int64_t> ids;
  for (py::handle item : row) {
    py::object as_int = py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr()));  // ints, NumPy's integers
    if (!as_int) {
      PyErr_Clear();
      throw ValueError(op, str_cat("ids: sequence ", index, " holds ", std::string(py::repr(item)), ", not an int"));
    }
    ids.push_back(py::cast<int64_t>(as_int));
  }
  return ids;
}

}  // namespace

Tensor ids_tensor(py::handle ids, const char* op) {
  if (py::isinstance<Tensor>(ids)) {
    Tensor t = py::cast<Tensor>(ids);
    MICROLLM_CHECK(t.dim() == 1 || t.dim() == 2, ShapeError, op, "ids must be [T] or [B, T], got ", t.shape());
    MICROLLM_CHECK(t.dtype() == DType::i64 || t.dtype() == DType::i32, DTypeError, op, "ids must be i64 or i32, got ",
                   dtype_name(t.dtype()));
    const std::vector<int64_t> flat = t.to(Device::cpu(), DType::i64).to_vector<int64_t>();
    const int64_t rows = t.dim() == 1 ? 1 : t.size(0);
    return Tensor::from_vector(flat, {rows, t.size(t.dim() - 1)});
  }
  if (py::isinstance<py::list>(ids) || py::isinstance<py::tuple>(ids)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(ids);
    const bool nested = seq.size() > 0 && (py::isinstance<py::list>(seq[0]) || py::isinstance<py::tuple>(seq[0]) ||
                                          py::hasattr(seq[0], "__len__"));
    std::vector<std::vector<int64_t>> rows;
    if (nested) {
      for (size_t i = 0; i < seq.size(); ++i) rows.push_back(int_row(seq[i], op, i));
    } else {
      rows.push_back(int_row(seq, op, 0));
    }
    MICROLLM_CHECK(!rows.empty() && !rows[0].empty(), ValueError, op, "ids hold no token");
    std::vector<int64_t> flat;
    for (size_t i = 0; i < rows.size(); ++i) {
      MICROLLM_CHECK(rows[i].size() == rows[0].size(), ShapeError, op, "ids: sequence ", i, " has ", rows[i].size(),
                     " ids, sequence 0 has ", rows[0].size(), " (all must have the same length)");
      flat.insert(flat.end(), rows[i].begin(), rows[i].end());
    }
    return Tensor::from_vector(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  }
  // Anything NumPy reads as integers (an ndarray, a torch tensor on the CPU, ...).
  py::array array = py::array::ensure(ids);
  if (!array) throw py::type_error("ids must be a list of ints, a list of lists, a microllm.Tensor or an array");
  const char kind = array.dtype().kind();
  MICROLLM_CHECK(kind == 'i' || kind == 'u', DTypeError, op, "ids must be integers, got an array of ",
                 std::string(py::str(array.dtype())));
  MICROLLM_CHECK(array.ndim() == 1 || array.ndim() == 2, ShapeError, op, "ids must be [T] or [B, T], got ",
                 array.ndim(), " dims");
  auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  const int64_t rows = array.ndim() == 1 ? 1 : array.shape(0);
  const int64_t cols = array.shape(array.ndim() - 1);
  std::vector<int64_t> flat(wide.data(), wide.data() + wide.size());
  return Tensor::from_vector(flat, {rows, cols});
}

std::vector<int32_t> id_list(py::handle ids, const char* op) {
  if ((py::isinstance<py::list>(ids) || py::isinstance<py::tuple>(ids)) && py::len(ids) == 0) return {};
  const Tensor t = ids_tensor(ids, op);
  MICROLLM_CHECK(t.size(0) == 1, ShapeError, op, "expected one sequence of ids, got ", t.size(0));
  const std::vector<int64_t> wide = t.to_vector<int64_t>();
  return std::vector<int32_t>(wide.begin(), wide.end());
}

namespace {

ModelHandle load(const std::string& path, const std::string& device, const std::string& dtype) {
  auto loaded = std::make_shared<LoadedModel>();
  loaded->directory = path;
  loaded->device = Device::parse(device);
  loaded->dtype = parse_dtype(dtype);
  MICROLLM_CHECK(loaded->dtype == DType::f32 || loaded->dtype == DType::bf16, ValueError, "load_model",
                 "dtype must be f32 or bf16, got ", dtype);
  py::gil_scoped_release no_gil;
  models::LoadOptions options;
  options.device = loaded->device;
  options.dtype = loaded->dtype;
  models::LoadedModel weights = models::load_model(path, options);
  weights.model->fuse_projections();  // q/k/v and gate/up as one GEMM each, as the CLI runs it
  loaded->model = std::move(weights.model);
  loaded->tokenizer = Tokenizer::load_if_present(path);
  return loaded;
}

// ids checked against the vocabulary and the window, as `microllm logits` checks them, then moved to the device.
Tensor model_input(const LoadedModel& m, py::handle ids, const char* op) {
  const Tensor host = ids_tensor(ids, op);
  const int64_t vocab = m.config().vocab_size;
  for (int64_t id : host.to_vector<int64_t>()) {
    MICROLLM_CHECK(id >= 0 && id < vocab, ValueError, op, "id ", id, " is outside the vocabulary of ", vocab);
  }
  MICROLLM_CHECK(host.size(1) <= m.config().max_position_embeddings, ValueError, op, host.size(1),
                 " tokens exceed the model's window of ", m.config().max_position_embeddings);
  return host.to(m.device);
}

Tensor logits(const LoadedModel& m, py::handle ids) {
  const Tensor input = model_input(m, ids, "logits");
  py::gil_scoped_release no_gil;
  autograd::NoGradGuard no_grad;
  nn::ForwardContext ctx;
  ctx.compute_dtype = m.dtype;
  return m.model->forward(input, ctx).value().to(Device::cpu(), DType::f32);  // [B, T, V]
}

// name -> value of every point the patterns select (nn/taps.h), in forward order (a dict keeps it).
py::dict taps(const LoadedModel& m, py::handle ids, std::vector<std::string> patterns) {
  const Tensor input = model_input(m, ids, "taps");
  nn::Taps recorder(std::move(patterns));
  {
    py::gil_scoped_release no_gil;
    autograd::NoGradGuard no_grad;
    nn::ForwardContext ctx;
    ctx.compute_dtype = m.dtype;
    ctx.taps = &recorder;
    m.model->forward(input, ctx);
  }
  py::dict out;
  for (const nn::TapRecord& record : recorder.values()) out[py::str(record.name)] = py::cast(record.tensor);
  return out;
}

std::vector<Tensor> attention_weights(const LoadedModel& m, py::handle ids, std::vector<int> layers) {
  const Tensor input = model_input(m, ids, "attention_weights");
  if (layers.empty()) {
    for (int i = 0; i < static_cast<int>(m.config().num_layers); ++i) layers.push_back(i);
  }
  py::gil_scoped_release no_gil;
  nn::ForwardContext ctx;
  ctx.compute_dtype = m.dtype;
  return nn::attention_weights(*m.model, input, layers, ctx);
}

// Each layer's sliding window (0: full attention).
std::vector<int64_t> layer_windows(const nn::TransformerConfig& c) {
  std::vector<int64_t> windows;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) windows.push_back(c.window_of(layer));
  return windows;
}

py::dict config_dict(const nn::TransformerConfig& c) {
  py::dict d;
  d["model_type"] = c.model_type;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_layers"] = c.num_layers;
  d["num_heads"] = c.num_heads;
  d["num_kv_heads"] = c.num_kv_heads;
  d["head_dim"] = c.resolved_head_dim();
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope.theta;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["bos_token_id"] = c.bos_token_id >= 0 ? py::object(py::int_(c.bos_token_id)) : py::object(py::none());
  d["eos_token_ids"] = c.eos_token_ids;
  d["attention_bias"] = c.attention_bias;
  d["qk_norm"] = c.qk_norm;
  d["layer_windows"] = layer_windows(c);
  return d;
}

void bind_config(py::module_& m) {
  using C = nn::TransformerConfig;
  py::class_<C>(m, "ModelConfig", "A model's architecture as read from config.json (read-only)")
      .def_readonly("model_type", &C::model_type)
      .def_readonly("vocab_size", &C::vocab_size)
      .def_readonly("hidden_size", &C::hidden_size)
      .def_readonly("intermediate_size", &C::intermediate_size)
      .def_readonly("num_layers", &C::num_layers)
      .def_readonly("num_heads", &C::num_heads)
      .def_readonly("num_kv_heads", &C::num_kv_heads)
      .def_property_readonly("head_dim", &C::resolved_head_dim)
      .def_readonly("rms_norm_eps", &C::rms_norm_eps)
      .def_property_readonly("rope_theta", [](const C& c) { return c.rope.theta; })
      .def_readonly("tie_word_embeddings", &C::tie_word_embeddings)
      .def_readonly("max_position_embeddings", &C::max_position_embeddings)
      .def_property_readonly("bos_token_id",
                             [](const C& c) { return c.bos_token_id >= 0 ? std::optional(c.bos_token_id) : std::nullopt; })
      .def_readonly("eos_token_ids", &C::eos_token_ids)
      .def_readonly("attention_bias", &C::attention_bias)
      .def_readonly("qk_norm", &C::qk_norm)
      .def_property_readonly("layer_windows", &layer_windows, "Each layer's sliding window in keys (0: full attention)")
      .def_property_readonly("num_parameters", &C::num_parameters)
      .def("to_dict", &config_dict, "The fields as a dict")
      .def("__repr__", [](const C& c) { return "ModelConfig(" + std::string(py::repr(config_dict(c))) + ")"; });
}

}  // namespace

void bind_models(py::module_& m) {
  bind_config(m);
  bind_tokenizer(m);

  py::class_<LoadedModel, ModelHandle>(m, "Model", "A language model loaded by microllm.load_model")
      .def_property_readonly("config", [](const LoadedModel& self) { return self.config(); })
      .def_property_readonly("device", [](const LoadedModel& self) { return self.device.str(); })
      .def_property_readonly("dtype", [](const LoadedModel& self) { return std::string(dtype_name(self.dtype)); })
      .def_property_readonly("path", [](const LoadedModel& self) { return self.directory; })
      .def_property_readonly("tokenizer", [](const LoadedModel& self) { return self.tokenizer; },
                             "The folder's tokenizer, or None for a byte-level model")
      .def_property_readonly("num_parameters", [](const LoadedModel& self) { return self.config().num_parameters(); })
      .def("logits", &logits, py::arg("ids"),
           "Logits [B, T, vocab] f32 (computed in the model's dtype) of ids [T] or [B, T], as `microllm logits`")
      .def("taps", &taps, py::arg("ids"), py::arg("patterns") = std::vector<std::string>{},
           "Activations of one forward: name -> Tensor for every point the patterns select (nn/taps.h)")
      .def("attention_weights", &attention_weights, py::arg("ids"), py::arg("layers") = std::vector<int>{},
           "Softmax attention probabilities [B, heads, T, T] f32 of each layer asked for (all by default)")
      .def("__repr__", [](const LoadedModel& self) {
        return str_cat("Model(", self.directory, ", ", self.config().model_type, ", ", self.config().num_parameters(),
                       " parameters, ", self.device.str(), ", ", dtype_name(self.dtype), ")");
      });

  m.def("load_model", &load, py::arg("path"), py::arg("device") = "cpu", py::arg("dtype") = "f32",
        "Loads a Hugging Face model folder or a microllm checkpoint (config.json + safetensors; tokenizer when "
        "present) on a device (cpu, cuda, cuda:N) in f32 or bf16");

  bind_generation(m);
  bind_engine(m);
}

}  // namespace microllm::python
