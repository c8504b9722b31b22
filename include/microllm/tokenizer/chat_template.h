// Chat templates: a conversation rendered to the prompt text a chat model was trained on, byte for byte
// what transformers' apply_chat_template(..., tokenize=False) makes of the model's Jinja template.
//
// Built-in renderers, one per template family, chosen by recognising the template's source text (several
// fragments must all be present). A general Jinja engine would have to reproduce Python's string methods,
// Jinja's whitespace control and json.dumps to be exact; a renderer per family is a page of plain code
// that the golden files check line by line. A template of no known family is a NotSupportedError.
//
//   ChatTemplate chat = tokenizer.chat_template();
//   std::string prompt = chat.render({{"system", "Be brief."}, {"user", "Hi!"}}, {.add_generation_prompt = true});
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace microllm {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool" (tool results, as plain text)
  std::string content;
  // Qwen3: an assistant turn's reasoning given apart from its content (otherwise taken from <think>...</think>).
  std::optional<std::string> reasoning_content = std::nullopt;
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the header of the assistant's next turn
  // Qwen3: false closes an empty <think></think> block so the model answers without reasoning; unset
  // leaves the template's default (thinking on).
  std::optional<bool> enable_thinking = std::nullopt;
};

enum class ChatFamily {
  qwen2_5,      // ChatML with a default system prompt (Qwen2.5-Instruct; also Qwen2.5-Coder/-Math variants)
  qwen3,        // ChatML with <think> handling and enable_thinking (Qwen3)
  deepseek_r1,  // DeepSeek-R1 and its distills (DeepSeek-R1-Distill-Qwen/-Llama)
  deepseek_v3,  // DeepSeek-V3
  llama3,       // Llama 3 (the original template and the later one with add_generation_prompt)
};

class ChatTemplate {
 public:
  // Recognises the family of a Jinja template (tokenizer_config.json's "chat_template"). `bos_token` and
  // `eos_token` are the strings the template receives (DeepSeek and Llama write bos_token).
  // Throws NotSupportedError for an unknown template.
  static ChatTemplate from_source(std::string_view jinja_source, std::string bos_token = "",
                                  std::string eos_token = "");
  // A family's official template without its source.
  static ChatTemplate builtin(ChatFamily family, std::string bos_token = "", std::string eos_token = "");

  // ValueError for a conversation the template cannot render (Qwen: an empty one).
  std::string render(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;
  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) const {
    return render(std::span<const ChatMessage>(messages), options);
  }

  ChatFamily family() const { return family_; }
  static const char* family_name(ChatFamily family);

 private:
  ChatTemplate(ChatFamily family, std::string bos, std::string eos)
      : family_(family), bos_(std::move(bos)), eos_(std::move(eos)) {}

  ChatFamily family_;
  std::string bos_, eos_;
  std::string default_system_ = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";  // qwen2_5
  bool always_generation_prompt_ = false;  // llama3: the original template ends with the header regardless
};

}  // namespace microllm
