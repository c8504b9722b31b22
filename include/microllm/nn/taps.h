// Activation taps: named points of the model's forward (the training graph, nn::TransformerLM) whose values, and
// in training the gradients of the loss at the same points, a study can read. A forward with
// ForwardContext::taps set reports every point the Taps selects; without one, nothing is named or copied.
//
// The points carry the module names transformers uses, so a hook on the same module there gives the same tensor
// (tools/oracle/align_reference.py does exactly that). For block i (prefix model.layers.i):
//   model.embed_tokens                          [B, T, hidden]    the embedding rows
//   ...input_layernorm                          [B, T, hidden]    the block's input, normalized
//   ...self_attn.{q,k,v}_proj                   [B, T, H*D]       the projections (bias included)
//   ...self_attn.{q,k}_norm                     [B, T, H, D]      QK-norm (Qwen3) before the rotary embedding
//   ...self_attn.{q,k}_rotary                   [B, T, H, D]      after the rotary embedding
//   ...self_attn.attn_weights                   [B, Hq, T, T] f32 softmax(q k^T * scale, causal): only when a
//                                                                 pattern names it (it is T^2 per head)
//   ...self_attn.o_proj.input                   [B, T, Hq*D]      attention output, heads concatenated
//   ...self_attn.o_proj                         [B, T, hidden]    the attention block's output
//   ...post_attention_layernorm                 [B, T, hidden]    pre-norm blocks: the MLP's input norm;
//                                                                 sandwich blocks: the normalized attention
//   ...attention_residual                       [B, T, hidden]    block input + attention
//   ...pre_feedforward_layernorm                [B, T, hidden]    sandwich blocks: the MLP's input norm
//   ...mlp.{gate,up}_proj                       [B, T, inter]
//   ...mlp.down_proj.input                      [B, T, inter]     act(gate) * up
//   ...mlp                                      [B, T, hidden]    the MLP's output
//   ...post_feedforward_layernorm               [B, T, hidden]    sandwich blocks: the normalized MLP output
//   model.layers.i                              [B, T, hidden]    the block's output (the residual stream)
//   model.norm                                  [B, T, hidden]    the final norm
//   logits                                      [B, T, vocab]
// Values are copies in the compute dtype on the model's device (attention weights in f32).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "microllm/autograd/variable.h"

namespace microllm::nn {

struct TapRecord {
  std::string name;
  Tensor tensor;
};

class Taps {
 public:
  // Called as each value (forward) or gradient (backward) is produced; the tensor may be reused afterwards
  // unless the callback copies it. Without callbacks the taps keep copies (values(), gradients()).
  using Callback = std::function<void(const std::string& name, const Tensor& tensor)>;

  // Patterns select points by name, '*' matching any run of characters ("model.layers.3.*", "*.mlp"); no
  // pattern selects every point except the attention weights, which only a pattern containing "attn_weights"
  // or "self_attn" selects ("*attn_weights", "model.layers.0.self_attn.*").
  explicit Taps(std::vector<std::string> patterns = {});

  // Also record the gradient of backward's output at each selected point (training: the forward must record a
  // graph, i.e. grad mode on and some input requiring a gradient).
  Taps& with_gradients(bool on = true);
  Taps& on_value(Callback callback);
  Taps& on_gradient(Callback callback);

  bool records_gradients() const { return gradients_; }
  bool wants(const std::string& name) const;

  // The point `name` of a forward: records x's value when selected and returns x, or, with gradients, an
  // identity of x whose backward records the gradient that flows through it.
  autograd::Variable operator()(const std::string& name, const autograd::Variable& x);
  // A value that is not on the graph (attention weights): recorded when selected.
  void record(const std::string& name, const Tensor& value);

  // What was recorded, in the order produced (values: forward order; gradients: backward order).
  const std::vector<TapRecord>& values() const { return values_; }
  const std::vector<TapRecord>& gradients() const { return gradients_recorded_; }
  const Tensor* value(std::string_view name) const;     // null when not recorded
  const Tensor* gradient(std::string_view name) const;  // null when not recorded
  void clear();

 private:
  std::vector<std::string> patterns_;
  bool gradients_ = false;
  Callback on_value_, on_gradient_;
  std::vector<TapRecord> values_, gradients_recorded_;
};

}  // namespace microllm::nn
