// microllm.Tokenizer: the library's Hugging Face tokenizers (tokenizer/tokenizer.h) with transformers' names
// (encode adds special tokens by default, as transformers does), and apply_chat_template rendering a folder's
// template exactly as `microllm template` does (ChatTemplate::from_directory + render_json).
#include <pybind11/stl.h>

#include <filesystem>

#include "microllm/core/error.h"
#include "model_bindings.h"

namespace microllm::python {

namespace {

std::vector<int32_t> encode(const Tokenizer& tokenizer, py::handle text, bool add_special_tokens) {
  const std::string bytes = text_bytes(text);
  py::gil_scoped_release no_gil;
  return tokenizer.encode(bytes, add_special_tokens);
}

std::vector<std::vector<int32_t>> encode_batch(const Tokenizer& tokenizer, const py::sequence& texts,
                                               bool add_special_tokens) {
  std::vector<std::string> inputs;
  for (py::handle text : texts) inputs.push_back(text_bytes(text));
  std::vector<std::vector<int32_t>> out(inputs.size());
  py::gil_scoped_release no_gil;
  for (size_t i = 0; i < inputs.size(); ++i) out[i] = tokenizer.encode(inputs[i], add_special_tokens);
  return out;
}

py::str decode(const Tokenizer& tokenizer, py::handle ids, bool skip_special_tokens) {
  const std::vector<int32_t> list = id_list(ids, "decode");
  std::string text;
  {
    py::gil_scoped_release no_gil;
    text = tokenizer.decode(list, skip_special_tokens);
  }
  return python_text(text);
}

// The chat template as transformers would use it: a folder's (chat_template.jinja or tokenizer_config.json's,
// with every special token of tokenizer_config.json), else the tokenizer's own; `source` overrides both.
ChatTemplate chat_template_of(const Tokenizer& tokenizer, const std::optional<std::string>& source, bool with_tools) {
  if (source) {
    return ChatTemplate::from_source(*source, tokenizer.bos_token().value_or(""), tokenizer.eos_token().value_or(""));
  }
  if (std::filesystem::is_directory(tokenizer.source())) return ChatTemplate::from_directory(tokenizer.source(), with_tools);
  return tokenizer.chat_template();
}

py::object apply_chat_template(const Tokenizer& tokenizer, const py::object& messages, bool add_generation_prompt,
                               const py::object& tools, const py::object& documents, bool tokenize,
                               const std::optional<std::string>& chat_template, const py::kwargs& variables) {
  py::object dumps = py::module_::import("json").attr("dumps");
  ChatTemplateInput input;
  input.messages_json = py::cast<std::string>(dumps(messages));
  input.add_generation_prompt = add_generation_prompt;
  if (!tools.is_none()) input.tools_json = py::cast<std::string>(dumps(tools));
  if (!documents.is_none()) input.documents_json = py::cast<std::string>(dumps(documents));
  input.variables_json = py::cast<std::string>(dumps(variables));
  std::string text;
  std::vector<int32_t> ids;
  {
    py::gil_scoped_release no_gil;
    text = chat_template_of(tokenizer, chat_template, !tools.is_none()).render_json(input);
    if (tokenize) ids = tokenizer.encode(text, /*add_special_tokens=*/false);
  }
  if (tokenize) return py::cast(ids);
  return python_text(text);
}

std::string repr(const Tokenizer& tokenizer) {
  return str_cat("Tokenizer(", tokenizer.source(), ", vocab_size=", tokenizer.vocab_size(), ")");
}

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer",
                        "A Hugging Face tokenizer (tokenizer.json, tokenizer_config.json, or GPT-2's vocab.json + "
                        "merges.txt) with ids and text equal to the `tokenizers` library's")
      .def(py::init([](const std::string& path) {
             py::gil_scoped_release no_gil;
             return Tokenizer::load(path);
           }),
           py::arg("path"), "Loads a tokenizer.json file or a folder")
      .def_static(
          "from_pretrained",
          [](const std::string& path) {
            py::gil_scoped_release no_gil;
            return Tokenizer::load(path);
          },
          py::arg("path"), "Loads the tokenizer of a model folder (or a tokenizer.json file)")
      .def_static(
          "from_json", [](const std::string& json_text) { return Tokenizer::from_json_text(json_text); },
          py::arg("json_text"), "A tokenizer from a tokenizer.json's text")
      .def("encode", &encode, py::arg("text"), py::arg("add_special_tokens") = true,
           "Token ids of text; add_special_tokens applies the post-processor (Llama 3's <|begin_of_text|>)")
      .def("encode_batch", &encode_batch, py::arg("texts"), py::arg("add_special_tokens") = true)
      .def("decode", &decode, py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def(
          "decode_batch",
          [](const Tokenizer& tokenizer, const py::sequence& batch, bool skip_special_tokens) {
            py::list out;
            for (py::handle ids : batch) out.append(decode(tokenizer, ids, skip_special_tokens));
            return out;
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def("token_to_id", [](const Tokenizer& tokenizer, const std::string& token) { return tokenizer.token_to_id(token); },
           py::arg("token"), "The id of a token, or None")
      .def(
          "id_to_token",
          [](const Tokenizer& tokenizer, int32_t id) -> py::object {
            const std::optional<std::string> token = tokenizer.id_to_token(id);
            return token ? py::object(python_text(*token)) : py::object(py::none());
          },
          py::arg("id"), "The token of an id, or None")
      .def("is_special", &Tokenizer::is_special, py::arg("id"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size,
                             "Distinct tokens, model plus added (transformers' len(tokenizer))")
      .def("__len__", &Tokenizer::vocab_size)
      .def_property_readonly("bos_token", &Tokenizer::bos_token)
      .def_property_readonly("eos_token", &Tokenizer::eos_token)
      .def_property_readonly("bos_token_id", &Tokenizer::bos_id)
      .def_property_readonly("eos_token_id", &Tokenizer::eos_id)
      .def_property_readonly("pad_token_id", &Tokenizer::pad_id)
      .def("stop_ids", &Tokenizer::stop_ids, py::arg("chat") = false,
           "The ids that end generation: eos, and with chat the template's end-of-turn tokens")
      .def_property_readonly("chat_template", &Tokenizer::chat_template_source,
                             "tokenizer_config.json's chat template source, or None")
      .def_property_readonly("source", &Tokenizer::source, "The file or folder it was loaded from")
      .def("apply_chat_template", &apply_chat_template, py::arg("messages"), py::arg("add_generation_prompt") = false,
           py::arg("tools") = py::none(), py::arg("documents") = py::none(), py::arg("tokenize") = false,
           py::arg("chat_template") = py::none(),
           "The conversation (a list of message dicts) rendered by the chat template, as transformers' "
           "apply_chat_template(tokenize=False) and `microllm template`; other keyword arguments become template "
           "variables (enable_thinking=False). tokenize=True returns the ids instead.")
      .def("__repr__", &repr);
}

}  // namespace microllm::python
