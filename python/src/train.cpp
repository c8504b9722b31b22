// Training from Python: microllm.Trainer over train::Trainer (config from a dict or a JSON file, one step at a
// time or run() with callbacks that may stop it, parameters as tensors), and autograd: microllm.Variable with
// requires_grad, backward() and grad, and the differentiable functions of microllm.autograd.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "bindings.h"
#include "microllm/autograd/functions.h"
#include "microllm/autograd/variable.h"
#include "microllm/train/trainer.h"

namespace microllm::python {

namespace {

using autograd::Variable;

// A config from a dict (json.dumps-able), a path to a JSON file, or a JSON string starting with '{'; keyword
// overrides on top. Unknown keys are the library's ParseError naming them.
train::TrainConfig config_from(const py::object& config, const py::dict& overrides) {
  const py::module_ json = py::module_::import("json");
  nlohmann::json merged = nlohmann::json::object();
  if (py::isinstance<py::dict>(config)) {
    merged = nlohmann::json::parse(py::str(json.attr("dumps")(config)).cast<std::string>());
  } else if (!config.is_none()) {
    const std::string text = py::str(config).cast<std::string>();
    if (!text.empty() && text.front() == '{') {
      merged = nlohmann::json::parse(text);
    } else {
      std::ifstream in(text);
      if (!in) throw IoError(text, "cannot open the training config");
      std::stringstream buffer;
      buffer << in.rdbuf();
      return config_from(py::str(buffer.str()), overrides);
    }
  }
  const nlohmann::json extra = nlohmann::json::parse(py::str(json.attr("dumps")(overrides)).cast<std::string>());
  for (const auto& [key, value] : extra.items()) merged[key] = value;
  return train::TrainConfig::from_json(merged.dump(), "python config");
}

py::dict step_dict(const train::StepMetrics& m) {
  py::dict d;
  d["step"] = m.step, d["loss"] = m.loss, d["lr"] = m.lr, d["grad_norm"] = m.grad_norm;
  d["tokens_per_second"] = m.tokens_per_second, d["elapsed_seconds"] = m.elapsed_seconds, d["tokens"] = m.tokens;
  return d;
}

py::dict eval_dict(const train::EvalMetrics& m) {
  py::dict d;
  d["step"] = m.step, d["loss"] = m.loss, d["nats_per_byte"] = m.nats_per_byte, d["seconds"] = m.seconds;
  return d;
}

// Trainer::run with Python callbacks. Each is called with the GIL held; one that returns False stops the run as
// Ctrl-C does (after the step, with a checkpoint); one that raises stops it the same way and the exception is
// raised again once the run has ended. Ctrl-C itself stops the run and raises KeyboardInterrupt after it.
py::dict run_with_callbacks(train::Trainer& trainer, const py::object& on_log, const py::object& on_eval,
                            const py::object& on_step, const py::object& on_checkpoint) {
  std::optional<py::error_already_set> raised;
  bool stopped_by_callback = false;
  auto call = [&](const py::object& callback, auto&&... args) {
    if (callback.is_none() || raised) return;
    py::gil_scoped_acquire gil;
    try {
      const py::object answer = callback(std::forward<decltype(args)>(args)...);
      if (!answer.is_none() && !answer.cast<bool>()) {
        stopped_by_callback = true;
        train::request_interrupt();
      }
    } catch (py::error_already_set& e) {
      raised = std::move(e);
      train::request_interrupt();
    }
  };
  train::TrainCallbacks callbacks;
  callbacks.on_log = [&](const train::StepMetrics& m) {
    py::gil_scoped_acquire gil;
    call(on_log, step_dict(m));
  };
  callbacks.on_eval = [&](const train::EvalMetrics& m) {
    py::gil_scoped_acquire gil;
    call(on_eval, eval_dict(m));
  };
  callbacks.on_step = [&](int64_t step) { call(on_step, step); };
  callbacks.on_checkpoint = [&](const std::string& dir) { call(on_checkpoint, dir); };
  train::TrainResult result;
  {
    py::gil_scoped_release released;
    result = trainer.run(callbacks);
  }
  if (raised) throw std::move(*raised);
  if (result.interrupted && !stopped_by_callback) {
    PyErr_SetString(PyExc_KeyboardInterrupt,
                    ("training stopped by Ctrl-C; checkpoint " + result.checkpoint_dir).c_str());
    throw py::error_already_set();
  }
  py::dict out;
  out["steps"] = result.steps;
  out["stopped"] = result.interrupted;
  out["checkpoint_dir"] = result.checkpoint_dir;
  out["seconds"] = result.seconds;
  out["last_eval"] = result.last_eval ? py::object(eval_dict(*result.last_eval)) : py::object(py::none());
  return out;
}

void bind_trainer(py::module_& m) {
  py::class_<train::Trainer>(m, "Trainer", R"(A training run (train::Trainer): the model, optimizer, data and schedule.

    trainer = microllm.Trainer({"model": "tiny", "data": "data/tokens/austen", "steps": 100}, out_dir="runs/a")
    result = trainer.run(on_log=lambda m: print(m["step"], m["loss"]))    # False from a callback stops it

config: a dict, a JSON file's path or JSON text with train::TrainConfig's fields; keyword arguments override.)")
      .def(py::init([](const py::object& config, const py::kwargs& overrides) {
             const train::TrainConfig c = config_from(config, overrides);
             py::gil_scoped_release released;
             return std::make_unique<train::Trainer>(c);
           }),
           py::arg("config") = py::none())
      .def("run", &run_with_callbacks, py::arg("on_log") = py::none(), py::arg("on_eval") = py::none(),
           py::arg("on_step") = py::none(), py::arg("on_checkpoint") = py::none(),
           "Trains to config steps; returns {steps, stopped, checkpoint_dir, seconds, last_eval}")
      .def(
          "step", [](train::Trainer& t) { t.train_step(); }, py::call_guard<py::gil_scoped_release>(),
          "One optimizer step (grad_accum micro-batches)")
      .def(
          "evaluate",
          [](train::Trainer& t) {
            train::EvalMetrics m;
            {
              py::gil_scoped_release released;
              m = t.evaluate();
            }
            return eval_dict(m);
          },
          "The validation loss now")
      .def("save_checkpoint", &train::Trainer::save_checkpoint, py::arg("dir"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("steps_done", &train::Trainer::step)
      .def_property_readonly("resumed", &train::Trainer::resumed)
      .def_property_readonly(
          "config",
          [](const train::Trainer& t) { return py::module_::import("json").attr("loads")(t.config().to_json()); })
      .def(
          "parameters",
          [](train::Trainer& t) {
            py::dict out;
            for (const nn::ParameterInfo& p : t.model().named_parameters()) out[py::str(p.name)] = p.variable->value();
            return out;
          },
          "The model's parameters by Hugging Face name, as tensors sharing the trainer's memory (f32 masters)");
}

Variable as_variable(const py::object& x) {
  if (py::isinstance<Variable>(x)) return x.cast<Variable>();
  return Variable(x.cast<Tensor>(), false);
}

void bind_autograd(py::module_& m) {
  py::class_<Variable>(m, "Variable", R"(A tensor that autograd follows: Variable(tensor, requires_grad=True).

    w = microllm.Variable(microllm.from_numpy(np.ones((3, 2), np.float32)), requires_grad=True)
    loss = microllm.autograd.sum(microllm.autograd.matmul(x, w))
    loss.backward(); w.grad        # a Tensor)")
      .def(py::init([](const Tensor& value, bool requires_grad) { return Variable(value, requires_grad); }),
           py::arg("value"), py::arg("requires_grad") = false)
      .def_property_readonly("value", &Variable::value)
      .def_property_readonly("grad",
                             [](const Variable& v) -> py::object {
                               if (!v.grad().defined()) return py::none();
                               return py::cast(v.grad());
                             })
      .def_property("requires_grad", &Variable::requires_grad, &Variable::set_requires_grad)
      .def_property_readonly("is_leaf", &Variable::is_leaf)
      .def_property_readonly("shape",
                             [](const Variable& v) {
                               py::tuple shape(v.dim());
                               for (int d = 0; d < v.dim(); ++d) shape[d] = v.size(d);
                               return shape;
                             })
      .def("detach", &Variable::detach)
      .def("zero_grad", &Variable::zero_grad)
      .def(
          "backward",
          [](const Variable& v, const py::object& grad) {
            const Tensor seed = grad.is_none() ? Tensor() : grad.cast<Tensor>();
            py::gil_scoped_release released;
            v.backward(seed);
          },
          py::arg("grad_output") = py::none())
      .def("__add__", [](const Variable& a, const py::object& b) { return autograd::add(a, as_variable(b)); })
      .def("__sub__", [](const Variable& a, const py::object& b) { return autograd::sub(a, as_variable(b)); })
      .def("__mul__", [](const Variable& a, const py::object& b) { return autograd::mul(a, as_variable(b)); })
      .def("__truediv__", [](const Variable& a, const py::object& b) { return autograd::div(a, as_variable(b)); })
      .def("__matmul__", [](const Variable& a, const py::object& b) { return autograd::matmul(a, as_variable(b)); })
      .def("__neg__", [](const Variable& a) { return autograd::neg(a); });

  py::module_ ag = m.def_submodule("autograd", "Differentiable functions over Variables (autograd/functions.h)");
  auto unary = [&](const char* name, Variable (*f)(const Variable&)) {
    ag.def(
        name, [f](const py::object& x) { return f(as_variable(x)); }, py::arg("x"));
  };
  unary("neg", autograd::neg), unary("exp", autograd::exp), unary("log", autograd::log);
  unary("sqrt", autograd::sqrt), unary("sigmoid", autograd::sigmoid), unary("silu", autograd::silu);
  unary("tanh", autograd::tanh), unary("square", autograd::square), unary("contiguous", autograd::contiguous);
  ag.def(
      "sum", [](const py::object& x) { return autograd::sum(as_variable(x)); }, py::arg("x"));
  ag.def(
      "mean", [](const py::object& x) { return autograd::mean(as_variable(x)); }, py::arg("x"));
  ag.def(
      "matmul",
      [](const py::object& a, const py::object& b, bool transpose_a, bool transpose_b) {
        return autograd::matmul(as_variable(a), as_variable(b), transpose_a, transpose_b);
      },
      py::arg("a"), py::arg("b"), py::arg("transpose_a") = false, py::arg("transpose_b") = false);
  ag.def(
      "linear",
      [](const py::object& x, const py::object& weight, const py::object& bias) {
        return autograd::linear(as_variable(x), as_variable(weight), bias.is_none() ? Variable() : as_variable(bias));
      },
      py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  ag.def(
      "rms_norm",
      [](const py::object& x, const py::object& weight, double eps) {
        return autograd::rms_norm(as_variable(x), as_variable(weight), eps);
      },
      py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-6);
  ag.def(
      "softmax", [](const py::object& x, int64_t dim) { return autograd::softmax(as_variable(x), dim); }, py::arg("x"),
      py::arg("dim") = -1);
  ag.def(
      "log_softmax", [](const py::object& x, int64_t dim) { return autograd::log_softmax(as_variable(x), dim); },
      py::arg("x"), py::arg("dim") = -1);
  ag.def(
      "swiglu",
      [](const py::object& gate, const py::object& up) { return autograd::swiglu(as_variable(gate), as_variable(up)); },
      py::arg("gate"), py::arg("up"));
  ag.def(
      "embedding",
      [](const py::object& weight, const Tensor& ids) { return autograd::embedding(as_variable(weight), ids); },
      py::arg("weight"), py::arg("ids"));
  ag.def(
      "attention",
      [](const py::object& q, const py::object& k, const py::object& v, bool causal, double scale) {
        AttentionParams params;
        params.causal = causal;
        params.scale = scale;
        const Variable qv = as_variable(q), kv = as_variable(k), vv = as_variable(v);  // with the GIL held
        py::gil_scoped_release release;
        return autograd::attention(qv, kv, vv, params);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("causal") = true, py::arg("scale") = 0.0,
      "q [B, Hq, T, D], k and v [B, Hkv, S, D] -> [B, Hq, T, D] (scale 0: 1/sqrt(D))");
  ag.def(
      "rope",
      [](const py::object& x, const Tensor& positions, double theta) {
        RopeParams params;
        params.theta = theta;
        return autograd::rope(as_variable(x), positions, params);
      },
      py::arg("x"), py::arg("positions"), py::kw_only(), py::arg("theta") = 10000.0,
      "Rotary embedding (split-half pairs) of x [B, T, H, D] at positions [B, T] or [T]");
  ag.def(
      "cross_entropy",
      [](const py::object& logits, const Tensor& targets, int64_t ignore_index) {
        return autograd::cross_entropy(as_variable(logits), targets, ignore_index);
      },
      py::arg("logits"), py::arg("targets"), py::arg("ignore_index") = -100);
}

}  // namespace

void bind_train(py::module_& m) {
  bind_trainer(m);
  bind_autograd(m);
}

}  // namespace microllm::python
