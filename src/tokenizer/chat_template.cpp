// Chat templates over the Jinja engine: the variables transformers' apply_chat_template passes
// (render_jinja_template: messages, tools, documents, add_generation_prompt, then the tokenizer's
// special_tokens_map overridden by keyword arguments).
#include "microllm/tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_text.h"
#include "microllm/core/error.h"
#include "tokenizer/jinja_template.h"

namespace microllm {

namespace {

using jinja::Dict;
using jinja::Value;

Value json_argument(const std::string& text, const std::string& what, bool must_be_list) {
  if (text.empty()) return Value::none();
  Value v = jinja::value_from_json_text(text, what);
  if (must_be_list && !v.is_list()) throw ParseError("chat_template", str_cat(what, " must be a JSON list"));
  return v;
}

Dict base_variables(const ChatTemplate::SpecialTokens& special_tokens, const std::vector<std::string>& additional) {
  Dict variables;
  for (const auto& [name, token] : special_tokens) variables.set(name, Value(token));
  if (!additional.empty()) {
    jinja::List list;
    for (const std::string& token : additional) list.emplace_back(token);
    variables.set("additional_special_tokens", Value(std::move(list)));
  }
  return variables;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("chat_template", str_cat(path.string(), ": cannot open the file"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token of tokenizer_config.json: a string, or an AddedToken object with "content".
std::optional<std::string> token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

ChatTemplate ChatTemplate::from_directory(const std::string& directory, bool with_tools) {
  const std::filesystem::path dir(directory);
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::is_regular_file(config_path)) {
    config = detail::parse_json(read_text(config_path), "chat_template", config_path.string() + " is not JSON");
    if (!config.is_object()) throw ParseError("chat_template", config_path.string() + " is not a JSON object");
  }
  std::optional<std::string> source;
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja_path)) {
    source = read_text(jinja_path);
  } else if (config.contains("chat_template")) {
    const nlohmann::json& value = config["chat_template"];
    if (value.is_string()) {
      source = value.get<std::string>();
    } else if (value.is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
      std::optional<std::string> default_template, tool_use;
      for (const nlohmann::json& entry : value) {
        if (!entry.is_object() || !entry.value("name", nlohmann::json()).is_string() ||
            !entry.value("template", nlohmann::json()).is_string()) {
          throw ParseError("chat_template",
                           config_path.string() + ": chat_template entries need a name and a template");
        }
        if (entry["name"] == "default") default_template = entry["template"].get<std::string>();
        if (entry["name"] == "tool_use") tool_use = entry["template"].get<std::string>();
      }
      source = with_tools && tool_use ? tool_use : default_template;
      if (!source) {
        throw NotSupportedError("chat_template",
                                config_path.string() + ": several named chat templates and none is named 'default'");
      }
    } else {
      throw ParseError("chat_template", config_path.string() + ": chat_template is neither a string nor a list");
    }
  }
  if (!source) {
    throw ValueError("chat_template", str_cat(directory, ": no chat template (no chat_template.jinja, and ",
                                              "tokenizer_config.json has no chat_template)"));
  }
  SpecialTokens tokens;
  for (const char* name :
       {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(name)) continue;
    if (const std::optional<std::string> text = token_text(config[name])) tokens.emplace_back(name, *text);
  }
  ChatTemplate chat = from_source(*source, std::move(tokens));
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    for (const nlohmann::json& token : config["additional_special_tokens"]) {
      if (const std::optional<std::string> text = token_text(token)) chat.additional_special_tokens_.push_back(*text);
    }
  }
  return chat;
}

ChatTemplate ChatTemplate::from_source(std::string_view jinja_source, SpecialTokens special_tokens) {
  return ChatTemplate(std::make_shared<const jinja::Template>(jinja_source),
                      std::make_shared<const std::string>(jinja_source), std::move(special_tokens));
}

ChatTemplate ChatTemplate::from_source(std::string_view jinja_source, std::string bos_token, std::string eos_token) {
  SpecialTokens tokens;
  if (!bos_token.empty()) tokens.emplace_back("bos_token", std::move(bos_token));
  if (!eos_token.empty()) tokens.emplace_back("eos_token", std::move(eos_token));
  return from_source(jinja_source, std::move(tokens));
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatOptions& options) const {
  jinja::List list;
  for (const ChatMessage& m : messages) {
    Dict message;
    message.set("role", Value(m.role));
    message.set("content", Value(m.content));
    if (m.reasoning_content) message.set("reasoning_content", Value(*m.reasoning_content));
    list.emplace_back(std::move(message));
  }
  Dict variables = base_variables(special_tokens_, additional_special_tokens_);
  variables.set("messages", Value(std::move(list)));
  variables.set("tools", Value::none());
  variables.set("documents", Value::none());
  variables.set("add_generation_prompt", Value(options.add_generation_prompt));
  if (options.enable_thinking) variables.set("enable_thinking", Value(*options.enable_thinking));
  return template_->render(variables);
}

std::string ChatTemplate::render_json(const ChatTemplateInput& input) const {
  Dict variables = base_variables(special_tokens_, additional_special_tokens_);
  Value messages = jinja::value_from_json_text(input.messages_json, "the messages");
  if (!messages.is_list()) throw ParseError("chat_template", "the messages must be a JSON list");
  variables.set("messages", std::move(messages));
  variables.set("tools", json_argument(input.tools_json, "the tools", true));
  variables.set("documents", json_argument(input.documents_json, "the documents", true));
  variables.set("add_generation_prompt", Value(input.add_generation_prompt));
  if (!input.variables_json.empty()) {
    const Value extra = jinja::value_from_json_text(input.variables_json, "the template variables");
    if (!extra.is_dict()) throw ParseError("chat_template", "the template variables must be a JSON object");
    for (const auto& [name, value] : extra.as_dict().entries) variables.set(name, value);
  }
  return template_->render(variables, {.now_unix_seconds = input.now_unix_seconds});
}

bool ChatTemplate::reads_variable(std::string_view name) const { return template_->reads_variable(name); }

}  // namespace microllm
