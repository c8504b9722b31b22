// microllm.ops: the forward operators of include/microllm/ops/ops.h that take plain tensors, keyword arguments
// named as in C++, and the Tensor's arithmetic operators. Errors are the library's (microllm.ShapeError, ...), with
// its message. Every op runs with the GIL released: arguments are converted first, and nothing inside touches Python
// (a borrowed NumPy array's keep-alive takes the GIL itself when it is dropped).
//
// Not bound here: the backward functions (autograd's business), the optimizer steps, sampling and the fused decode
// step (paged_decode_attention: the generate layer's).
#include "microllm/ops/ops.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "microllm/ops/optim.h"
#include "tensor_interop.h"

namespace microllm::python {
namespace {

using Guard = py::call_guard<py::gil_scoped_release>;
using OptionalTensor = std::optional<Tensor>;

Tensor or_undefined(const OptionalTensor& t) { return t ? *t : Tensor(); }

bool is_python_number(py::handle value) {
  return py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value);
}

// A binary op's operands: tensors, or one tensor and a Python number, which becomes a rank-0 tensor of the other
// operand's dtype and device (so 2.5 added to an i32 tensor is 2). Nothing: neither is a tensor, or the other is no
// number (the Tensor operators then answer NotImplemented).
std::optional<std::pair<Tensor, Tensor>> binary_operands(py::handle a, py::handle b) {
  const bool a_tensor = py::isinstance<Tensor>(a), b_tensor = py::isinstance<Tensor>(b);
  if (a_tensor && b_tensor) return std::pair{a.cast<Tensor>(), b.cast<Tensor>()};
  if (a_tensor && is_python_number(b)) {
    const Tensor& t = a.cast<const Tensor&>();
    return std::pair{t, Tensor::scalar(b.cast<double>(), t.dtype(), t.device())};
  }
  if (b_tensor && is_python_number(a)) {
    const Tensor& t = b.cast<const Tensor&>();
    return std::pair{Tensor::scalar(a.cast<double>(), t.dtype(), t.device()), t};
  }
  return std::nullopt;
}

Tensor call_binary(BinaryOp op, const py::object& a, const py::object& b) {
  auto operands = binary_operands(a, b);
  if (!operands)
    throw py::type_error(str_cat(binary_op_name(op), " takes tensors, or a tensor and a number, not ",
                                 std::string(py::str(py::type::of(a))), " and ",
                                 std::string(py::str(py::type::of(b)))));
  py::gil_scoped_release release;
  return binary(op, operands->first, operands->second);
}

// The Tensor operator: NotImplemented lets Python try the other operand (an ndarray converts the tensor itself).
py::object binary_operator(BinaryOp op, py::handle a, py::handle b) {
  auto operands = binary_operands(a, b);
  if (!operands) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  Tensor result;
  {
    py::gil_scoped_release release;
    result = binary(op, operands->first, operands->second);
  }
  return py::cast(std::move(result));
}

AttentionParams attention_params(bool causal, double scale, int64_t q_offset) {
  AttentionParams params;
  params.causal = causal;
  params.scale = scale;
  params.q_offset = q_offset;
  return params;
}

RopeParams rope_params(double theta, const std::string& layout, const std::string& scaling, double factor,
                       double low_freq_factor, double high_freq_factor, int64_t original_max_position_embeddings) {
  RopeParams params;
  params.theta = theta;
  if (layout == "split_half")
    params.layout = RopeLayout::split_half;
  else if (layout == "interleaved")
    params.layout = RopeLayout::interleaved;
  else
    throw ValueError("rope", str_cat("unknown layout '", layout, "' (split_half or interleaved)"));
  if (scaling == "none")
    params.scaling.type = RopeScalingType::none;
  else if (scaling == "linear")
    params.scaling.type = RopeScalingType::linear;
  else if (scaling == "llama3")
    params.scaling.type = RopeScalingType::llama3;
  else
    throw ValueError("rope", str_cat("unknown scaling '", scaling, "' (none, linear or llama3)"));
  params.scaling.factor = factor;
  params.scaling.low_freq_factor = low_freq_factor;
  params.scaling.high_freq_factor = high_freq_factor;
  params.scaling.original_max_position_embeddings = original_max_position_embeddings;
  return params;
}

Dims dims_from_python(const py::object& dims) { return shape_from_python(dims); }

Dims all_dims(const Tensor& x) {
  Dims dims;
  for (int d = 0; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

void bind_elementwise(py::module_& ops) {
#define MICROLLM_BIND_UNARY(name)                                                \
  if (std::string_view(#name) != "scale" && std::string_view(#name) != "gelu" && \
      std::string_view(#name) != "gelu_tanh")                                    \
    ops.def(                                                                     \
        #name, [](const Tensor& x) { return unary(UnaryOp::name, x); }, py::arg("x"), Guard());
  MICROLLM_UNARY_OPS(MICROLLM_BIND_UNARY)
#undef MICROLLM_BIND_UNARY
  ops.def("gelu", &gelu, py::arg("x"), py::arg("tanh_approximation") = false, Guard(),
          "Exact (erf) GELU, or the tanh approximation (\"gelu_pytorch_tanh\")");
  ops.def("scale", &scale, py::arg("x"), py::arg("alpha"), Guard(), "x * alpha");

#define MICROLLM_BIND_BINARY(name)                                                                                     \
  ops.def(                                                                                                             \
      #name, [](const py::object& a, const py::object& b) { return call_binary(BinaryOp::name, a, b); }, py::arg("a"), \
      py::arg("b"));
  MICROLLM_BINARY_OPS(MICROLLM_BIND_BINARY)
#undef MICROLLM_BIND_BINARY

  ops.def("where", &where, py::arg("cond"), py::arg("a"), py::arg("b"), Guard(),
          "cond (u8, nonzero = true) ? a : b, all three broadcast");
  ops.def("masked_fill", &masked_fill, py::arg("x"), py::arg("mask"), py::arg("value"), Guard(),
          "x with value wherever mask (u8, broadcast to x) is nonzero");
  ops.def(
      "cast",
      [](const Tensor& x, const py::object& dtype) {
        const DType target = dtype_from_python(dtype);
        py::gil_scoped_release release;
        return cast(x, target);
      },
      py::arg("x"), py::arg("dtype"), "A new tensor of `dtype` (rounded to nearest even)");
  ops.def(
      "sum_to",
      [](const Tensor& x, const py::object& shape) {
        const Shape target = shape_from_python(shape);
        py::gil_scoped_release release;
        return sum_to(x, target);
      },
      py::arg("x"), py::arg("shape"), "Sums a broadcast tensor back to `shape`");
}

void bind_linear_algebra(py::module_& ops) {
  ops.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("transpose_a") = false, py::arg("transpose_b") = false,
          Guard(),
          "a [..., M, K] @ b [..., K, N] -> [..., M, N]; batch dims broadcast; transpose_a/b use the transpose of "
          "the last two dims without a copy");
  ops.def(
      "linear",
      [](const Tensor& x, const Tensor& weight, const OptionalTensor& bias) {
        return linear(x, weight, or_undefined(bias));
      },
      py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), Guard(), "x @ weight^T (+ bias)");
  ops.def(
      "linear_add",
      [](const Tensor& x, const Tensor& weight, const OptionalTensor& bias, const OptionalTensor& addend) {
        return linear_add(x, weight, or_undefined(bias), or_undefined(addend));
      },
      py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("addend") = py::none(), Guard(),
      "addend + x @ weight^T (+ bias), rounded once");
  ops.def("swiglu", &swiglu, py::arg("gate"), py::arg("up"), Guard(), "silu(gate) * up");
  ops.def("rms_norm", &rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"), Guard(),
          "weight * x / sqrt(mean(x^2, last dim) + eps), with Hugging Face's roundings");
  ops.def(
      "rms_norm_residual",
      [](const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
        RmsNormResult result = rms_norm_residual(x, residual, weight, eps);
        return std::pair{result.out, result.h};
      },
      py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"), Guard(),
      "(rms_norm(h), h) with h = x + residual");
  ops.def(
      "qk_rms_norm",
      [](const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight, double eps) {
        return qk_rms_norm(q, k, q_weight, k_weight, eps);
      },
      py::arg("q"), py::arg("k"), py::arg("q_weight"), py::arg("k_weight"), py::arg("eps"), Guard(),
      "(rms_norm(q, q_weight), rms_norm(k, k_weight)) over the head dim: QK-norm as one op (contiguous results)");
  ops.def(
      "rms_norm_linear",
      [](const Tensor& x, const OptionalTensor& residual, const Tensor& norm_weight, double eps, const Tensor& weight,
         const OptionalTensor& bias, const std::string& gate, const OptionalTensor& x_norm_weight) {
        GatedActivation g = GatedActivation::none;
        if (gate == "swiglu") {
          g = GatedActivation::swiglu;
        } else if (gate == "geglu") {
          g = GatedActivation::geglu;
        } else if (gate != "none") {
          throw ValueError("rms_norm_linear",
                           str_cat("gate must be \"none\", \"swiglu\" or \"geglu\", got \"", gate, "\""));
        }
        NormLinearResult result = rms_norm_linear(x, or_undefined(residual), norm_weight, eps, weight,
                                                  or_undefined(bias), g, or_undefined(x_norm_weight));
        return std::pair{result.out, result.h};
      },
      py::arg("x"), py::arg("residual"), py::arg("norm_weight"), py::arg("eps"), py::arg("weight"),
      py::arg("bias") = py::none(), py::arg("gate") = "none", py::arg("x_norm_weight") = py::none(), Guard(),
      "(out, h): h = x' + residual with x' = x or rms_norm(x) * x_norm_weight, out = rms_norm(h) @ weight^T + bias, "
      "gated over its halves with gate \"swiglu\" or \"geglu\"");
  ops.def("softmax", &softmax, py::arg("x"), py::arg("dim") = -1, Guard());
  ops.def("log_softmax", &log_softmax, py::arg("x"), py::arg("dim") = -1, Guard());
}

void bind_attention(py::module_& ops) {
  ops.def(
      "attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, int64_t q_offset,
         const OptionalTensor& mask, bool return_lse) -> py::object {
        AttentionResult result;
        {
          py::gil_scoped_release release;
          result = attention(q, k, v, attention_params(causal, scale, q_offset), or_undefined(mask));
        }
        if (return_lse) return py::make_tuple(result.out, result.lse);
        return py::cast(result.out);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("causal") = true, py::arg("scale") = 0.0,
      py::arg("q_offset") = 0, py::arg("mask") = py::none(), py::arg("return_lse") = false, R"doc(
Scaled dot-product attention with grouped-query heads: q [B, Hq, T, D], k and v [B, Hkv, S, D]. scale 0 means
1/sqrt(D); causal hides key j from query i when j > q_offset + i; mask (u8, broadcast to [B, Hq, T, S]) nonzero =
may attend. Returns out [B, Hq, T, D] (a view of [B, T, Hq, D] memory), or (out, lse [B, Hq, T] f32).)doc");
  ops.def(
      "attention_weights",
      [](const Tensor& q, const Tensor& k, bool causal, double scale, int64_t q_offset, const OptionalTensor& mask) {
        return attention_weights(q, k, attention_params(causal, scale, q_offset), or_undefined(mask));
      },
      py::arg("q"), py::arg("k"), py::kw_only(), py::arg("causal") = true, py::arg("scale") = 0.0,
      py::arg("q_offset") = 0, py::arg("mask") = py::none(), Guard(),
      "The attention probabilities [B, Hq, T, S] f32 under the same rules");
  ops.def(
      "rope",
      [](const Tensor& x, const Tensor& positions, double theta, const std::string& layout, const std::string& scaling,
         double factor, double low_freq_factor, double high_freq_factor, int64_t original_max_position_embeddings) {
        const RopeParams params = rope_params(theta, layout, scaling, factor, low_freq_factor, high_freq_factor,
                                              original_max_position_embeddings);
        py::gil_scoped_release release;
        return rope(x, positions, params);
      },
      py::arg("x"), py::arg("positions"), py::kw_only(), py::arg("theta") = 10000.0, py::arg("layout") = "split_half",
      py::arg("scaling") = "none", py::arg("factor") = 1.0, py::arg("low_freq_factor") = 1.0,
      py::arg("high_freq_factor") = 4.0, py::arg("original_max_position_embeddings") = 8192,
      "Rotary embedding of x [B, T, H, D] at positions [B, T] or [T] (i32/i64); layout split_half (Hugging "
      "Face's rotate_half) or interleaved; scaling none, linear or llama3");
  ops.def(
      "rope_inv_freq",
      [](int64_t head_dim, double theta, const std::string& scaling, double factor, double low_freq_factor,
         double high_freq_factor, int64_t original_max_position_embeddings) {
        return rope_inv_freq(rope_params(theta, "split_half", scaling, factor, low_freq_factor, high_freq_factor,
                                         original_max_position_embeddings),
                             head_dim);
      },
      py::arg("head_dim"), py::kw_only(), py::arg("theta") = 10000.0, py::arg("scaling") = "none",
      py::arg("factor") = 1.0, py::arg("low_freq_factor") = 1.0, py::arg("high_freq_factor") = 4.0,
      py::arg("original_max_position_embeddings") = 8192, "The head_dim/2 inverse frequencies, a list");
  ops.def("paged_kv_write", &paged_kv_write, py::arg("k_pool"), py::arg("v_pool"), py::arg("k"), py::arg("v"),
          py::arg("slots"), Guard(),
          "pool[slots[n]] = k[n] and v[n] (pools [blocks, block_size, Hkv, D], k and v [N, Hkv, D], slots i32 [N]; a "
          "negative slot skips its row); writes the pools in place");
  ops.def("paged_attention",
          py::overload_cast<const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            double, int64_t, int64_t>(&paged_attention),
          py::arg("q"), py::arg("k_pool"), py::arg("v_pool"), py::arg("block_tables"), py::arg("seq_ids"),
          py::arg("positions"), py::kw_only(), py::arg("scale") = 0.0, py::arg("max_context") = 0,
          py::arg("window") = 0, Guard(), R"doc(
Decode attention over a paged KV cache: q [N, Hq, D] against the keys 0..positions[n] (the last `window` of them
when window > 0) of sequence seq_ids[n], whose blocks block_tables [S, max_blocks] (i32) lists; positions[n] < 0 is
a padding row (output 0). scale 0 means 1/sqrt(D). Returns [N, Hq, D].)doc");
}

void bind_indexing_and_losses(py::module_& ops) {
  ops.def("embedding", &embedding, py::arg("weight"), py::arg("ids"), Guard(),
          "weight [V, D], ids (i32/i64) -> [*ids.shape, D]");
  ops.def("concat", &concat, py::arg("tensors"), py::arg("dim"), Guard());
  ops.def("split", &split, py::arg("x"), py::arg("sizes"), py::arg("dim"), Guard(), "Views of consecutive pieces");
  ops.def(
      "topk",
      [](const Tensor& x, int64_t k) {
        TopK result = topk(x, k);
        return std::pair{result.values, result.indices};
      },
      py::arg("x"), py::arg("k"), Guard(), "(values, indices i64) of the k largest along the last dim, descending");
  ops.def("scatter_add", &scatter_add, py::arg("x"), py::arg("dim"), py::arg("index"), py::arg("src"), Guard(),
          "torch.scatter_add: a new tensor");
  ops.def("cross_entropy", &cross_entropy, py::arg("logits"), py::arg("targets"),
          py::arg("ignore_index") = kIgnoreIndex, Guard(),
          "Mean cross-entropy of logits [N, V] against targets [N], rank 0 f32 (f64 for f64)");
  ops.def("sum_squares", &sum_squares, py::arg("tensors"), Guard(), "f32 [n]: each tensor's sum of squares");
  ops.def("global_norm", &global_norm, py::arg("tensors"), Guard(), "f32 rank 0: the L2 norm of all elements");
}

void bind_reductions(py::module_& ops) {
  ops.def(
      "sum",
      [](const Tensor& x, const py::object& dims, bool keepdim) {
        if (dims.is_none() && !keepdim) {
          py::gil_scoped_release release;
          return sum(x);
        }
        const Dims reduced = dims.is_none() ? all_dims(x) : dims_from_python(dims);
        py::gil_scoped_release release;
        return sum(x, reduced, keepdim);
      },
      py::arg("x"), py::arg("dims") = py::none(), py::arg("keepdim") = false,
      "Over `dims` (an int or a sequence), or all elements (rank 0)");
  ops.def(
      "mean",
      [](const Tensor& x, const py::object& dims, bool keepdim) {
        if (dims.is_none() && !keepdim) {
          py::gil_scoped_release release;
          return mean(x);
        }
        const Dims reduced = dims.is_none() ? all_dims(x) : dims_from_python(dims);
        py::gil_scoped_release release;
        return mean(x, reduced, keepdim);
      },
      py::arg("x"), py::arg("dims") = py::none(), py::arg("keepdim") = false);
  ops.def(
      "max",
      [](const Tensor& x, const std::optional<int64_t>& dim, bool keepdim) {
        return dim ? max(x, *dim, keepdim) : max(x);
      },
      py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false, Guard());
  ops.def(
      "argmax",
      [](const Tensor& x, const std::optional<int64_t>& dim, bool keepdim) {
        return dim ? argmax(x, *dim, keepdim) : argmax(x);
      },
      py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false, Guard(),
      "i64 indices (into the flattened tensor without dim)");
}

void bind_tensor_operators(py::module_& m) {
  auto tensor = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  const std::pair<const char*, BinaryOp> forward[] = {{"__add__", BinaryOp::add},
                                                      {"__sub__", BinaryOp::sub},
                                                      {"__mul__", BinaryOp::mul},
                                                      {"__truediv__", BinaryOp::div}};
  const std::pair<const char*, BinaryOp> reflected[] = {{"__radd__", BinaryOp::add},
                                                        {"__rsub__", BinaryOp::sub},
                                                        {"__rmul__", BinaryOp::mul},
                                                        {"__rtruediv__", BinaryOp::div}};
  for (const auto& [name, op] : forward)
    tensor.def(
        name, [op = op](const py::object& self, const py::object& other) { return binary_operator(op, self, other); },
        py::is_operator());
  for (const auto& [name, op] : reflected)
    tensor.def(
        name, [op = op](const py::object& self, const py::object& other) { return binary_operator(op, other, self); },
        py::is_operator());
  tensor.def(
      "__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, py::is_operator(), Guard());
  tensor.def(
      "__neg__", [](const Tensor& x) { return neg(x); }, Guard());
}

}  // namespace

void bind_ops(py::module_& m) {
  py::module_ ops = m.def_submodule("ops", "The library's operators on tensors (include/microllm/ops/ops.h)");
  bind_elementwise(ops);
  bind_linear_algebra(ops);
  bind_attention(ops);
  bind_indexing_and_losses(ops);
  bind_reductions(ops);
  bind_tensor_operators(m);
}

}  // namespace microllm::python
