// Chat templates: a conversation rendered to the prompt text a chat model was trained on, byte for byte what
// transformers' tokenizer.apply_chat_template(..., tokenize=False) makes of the model's Jinja template.
//
// The template runs on a Jinja engine of the tokenizer layer (src/tokenizer/jinja_*.cpp; docs/MODELS.md lists
// what it supports) with the variables transformers passes: messages, tools, documents,
// add_generation_prompt, the tokenizer's special tokens (bos_token, eos_token, ...) and extra keyword
// arguments (enable_thinking, ...).
//
//   ChatTemplate chat = tokenizer.chat_template();
//   std::string prompt = chat.render({{"system", "Be brief."}, {"user", "Hi!"}}, {.add_generation_prompt = true});
//   std::string with_tools = chat.render_json({.messages_json = R"([{"role": "user", "content": "Hi"}])",
//                                              .add_generation_prompt = true, .tools_json = tools});
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace microllm {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool" (tool results, as plain text)
  std::string content;
  // An assistant turn's reasoning given apart from its content (Qwen3 and others read it).
  std::optional<std::string> reasoning_content = std::nullopt;
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the header of the assistant's next turn
  // Passed as the template's enable_thinking when set (Qwen3: false closes an empty <think></think> block so
  // the model answers without reasoning); unset leaves it undefined, the template's default.
  std::optional<bool> enable_thinking = std::nullopt;
};

// Any conversation as transformers takes it, as JSON text.
struct ChatTemplateInput {
  std::string messages_json = {};      // the messages list: [{"role": "user", "content": "Hi"}, ...], any JSON
  bool add_generation_prompt = false;  // transformers' default
  std::string tools_json = {};         // a list of tool schemas; empty: tools is None
  std::string documents_json = {};     // a list of documents (RAG templates); empty: documents is None
  std::string variables_json = {};     // an object of extra keyword arguments ({"enable_thinking": false})
  // The clock strftime_now reads, as seconds since the epoch shown in UTC; unset: now, in local time.
  std::optional<int64_t> now_unix_seconds = std::nullopt;
};

class ChatTemplate {
 public:
  // The tokenizer's special tokens that transformers passes to every template (special_tokens_map), by name.
  using SpecialTokens = std::vector<std::pair<std::string, std::string>>;

  // Parses a Jinja template (tokenizer_config.json's "chat_template", or chat_template.jinja). Throws
  // ParseError for malformed syntax and NotSupportedError for a construct the engine does not implement,
  // naming the line, column and construct.
  static ChatTemplate from_source(std::string_view jinja_source, SpecialTokens special_tokens);
  // The same with bos_token and eos_token only; an empty string is not passed (the template sees it undefined).
  static ChatTemplate from_source(std::string_view jinja_source, std::string bos_token = "",
                                  std::string eos_token = "");
  // The template of a model or tokenizer folder as transformers loads it: chat_template.jinja, else
  // tokenizer_config.json's "chat_template" (a list of named templates gives "tool_use" when `with_tools` and
  // there is one, else "default"), with the special tokens of tokenizer_config.json (bos, eos, unk, sep, pad,
  // cls, mask and additional_special_tokens). ValueError when the folder has no chat template.
  static ChatTemplate from_directory(const std::string& directory, bool with_tools = false);

  // Renders messages with text content. ValueError for what the template raises (raise_exception: roles that
  // do not alternate, an empty conversation, ...) or what Python would (a type error), NotSupportedError for
  // what the engine cannot do; each names the template line.
  std::string render(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;
  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) const {
    return render(std::span<const ChatMessage>(messages), options);
  }
  // Renders JSON messages, tools, documents and extra variables (which override the special tokens, as
  // transformers' keyword arguments do). ParseError for JSON that does not parse or has the wrong shape.
  std::string render_json(const ChatTemplateInput& input) const;

  // Whether the template reads a variable of that name (e.g. "enable_thinking", "tools").
  bool reads_variable(std::string_view name) const;
  const std::string& source() const { return *source_; }

 private:
  ChatTemplate(std::shared_ptr<const jinja::Template> parsed, std::shared_ptr<const std::string> source,
               SpecialTokens special_tokens)
      : template_(std::move(parsed)), source_(std::move(source)), special_tokens_(std::move(special_tokens)) {}

  std::shared_ptr<const jinja::Template> template_;
  std::shared_ptr<const std::string> source_;
  SpecialTokens special_tokens_;
  std::vector<std::string> additional_special_tokens_;  // passed as a list when not empty
};

}  // namespace microllm
