// What the model, tokenizer, generation and engine bindings share (models.cpp registers them all through
// bind_models): the loaded model as Python holds it, token ids and text between Python and C++, and the rule
// that turns a prompt into ids as `microllm generate` does.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "microllm/core/tensor.h"
#include "microllm/generate/generate.h"
#include "microllm/nn/transformer.h"
#include "microllm/tokenizer/tokenizer.h"

namespace microllm::python {

// microllm.Model: the weights (fused for inference, as the CLI loads them), the folder's tokenizer when it has
// one, and where and in what dtype it computes. Shared by the Model object and any engine built over it, so the
// weights live while either does.
struct LoadedModel {
  std::shared_ptr<nn::TransformerLM> model;
  std::optional<Tokenizer> tokenizer;
  std::string directory;
  Device device = Device::cpu();
  DType dtype = DType::f32;

  const nn::TransformerConfig& config() const { return model->config(); }
};
using ModelHandle = std::shared_ptr<LoadedModel>;

// Python text -> bytes: str as UTF-8 (lone surrogates from surrogateescape turned back into their bytes), bytes
// as they are. TypeError for anything else.
std::string text_bytes(py::handle text);
// Bytes -> str, bytes that are not UTF-8 as surrogateescape's lone surrogates (so text_bytes gives them back).
py::str python_text(const std::string& bytes);

// Token ids [B, T] as an i64 host tensor from: a list of ints ([1, T]), a list of equal-length lists, a
// microllm.Tensor of integers, or anything NumPy turns into an integer array of 1 or 2 dims.
Tensor ids_tensor(py::handle ids, const char* op);
// One sequence of ids from a list of ints (or a 1-D integer array).
std::vector<int32_t> id_list(py::handle ids, const char* op);

// The prompt `microllm generate` makes: with `chat`, the folder's chat template over a user turn (after a system
// turn when `system` is given) or over a list of message dicts, with the reply header; else the text encoded with
// the tokenizer's special tokens, or its bytes for a byte-level model; a list of ints is taken as ids. An empty
// prompt starts from the bos token.
std::vector<int32_t> prompt_ids(const LoadedModel& m, py::handle prompt, bool chat, const std::optional<std::string>& system,
                                std::optional<bool> enable_thinking);

// The sampling keyword arguments of Model.generate; unset ones take generation_config.json's value as the CLI
// does (temperature: 0.8 when the folder says nothing).
struct GenerateArguments {
  int64_t max_tokens = 200;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  double presence_penalty = 0, frequency_penalty = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool chat = false;
};
generate::GenerateOptions generate_options(const LoadedModel& m, const GenerateArguments& args);

// Ids -> text as the CLI streams it: the tokenizer's StreamDecoder (special tokens skipped), or bytes (ids past
// 255 skipped) held back until they end on a UTF-8 character boundary.
generate::TextDecoder text_decoder(const LoadedModel& m, std::shared_ptr<void>& keep_alive);

void bind_tokenizer(py::module_& m);   // tokenizer.cpp: Tokenizer, apply_chat_template
void bind_generation(py::module_& m);  // generation.cpp: Model.generate, TextStream
void bind_engine(py::module_& m);      // engine.cpp: _Engine (continuous batching; llm.py's LLM wraps it)

}  // namespace microllm::python
