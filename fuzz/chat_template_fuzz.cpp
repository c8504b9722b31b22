// libFuzzer target: a Jinja chat template's source -> ChatTemplate (lexer, parser), then renderings over a fixed
// conversation with tools, by render() and render_json(). Any microllm::Error is an accepted answer (a syntax
// error, an unsupported construct, what the template raises); a crash, a sanitizer report, a hang, any other
// exception, or two renderings of the same input that differ, is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "microllm/core/error.h"
#include "microllm/tokenizer/chat_template.h"

namespace {

constexpr std::string_view kMessages = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": [{"type": "text", "text": "Hi é 你好"}, {"type": "image"}]},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "abc123def", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Köln", "days": 2, "hourly": true, "ratio": 0.5}}}]},
  {"role": "tool", "tool_call_id": "abc123def", "name": "get_weather", "content": "{\"t\": 21.5}"},
  {"role": "assistant", "content": "<think>\nwarm\n</think>\n\nIt is warm.", "reasoning_content": "warm"},
  {"role": "user", "content": "Thanks!"}])";

constexpr std::string_view kTools = R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
  "required": ["city"]}}}])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const microllm::ChatTemplate chat = microllm::ChatTemplate::from_source(source, "<s>", "</s>");
    try {
      const std::vector<microllm::ChatMessage> messages = {{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo", "r"}};
      (void)chat.render(messages, {.add_generation_prompt = true, .enable_thinking = false});
    } catch (const microllm::Error&) {
    }
    const microllm::ChatTemplateInput input{.messages_json = std::string(kMessages),
                                            .add_generation_prompt = true,
                                            .tools_json = std::string(kTools),
                                            .variables_json = R"({"enable_thinking": true, "date_string": "1 Jan"})",
                                            .now_unix_seconds = 1721995200};
    std::string first;
    try {
      first = chat.render_json(input);
    } catch (const microllm::Error&) {
      return 0;
    }
    if (chat.render_json(input) != first) __builtin_trap();  // rendering is deterministic
  } catch (const microllm::Error&) {
  }
  return 0;
}
