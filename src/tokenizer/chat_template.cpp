// Chat templates: one renderer per family, each a transcription of its official Jinja template for
// messages with text content (tool calls are not rendered). Detection compares fragments of the template
// source with whitespace and "\n" escapes removed, so a reformatted copy of a template is still recognised.
#include "microllm/tokenizer/chat_template.h"

#include "microllm/core/error.h"
#include "tokenizer/unicode.h"

namespace microllm {

namespace {

using tokenizer_detail::is_python_space;
using tokenizer_detail::utf8_next;

// ---- Python string methods the templates use ----

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// s.split(sep)[-1] and s.split(sep)[0]
std::string after_last(std::string_view s, std::string_view sep) {
  const size_t at = s.rfind(sep);
  return std::string(at == std::string_view::npos ? s : s.substr(at + sep.size()));
}
std::string before_first(std::string_view s, std::string_view sep) {
  const size_t at = s.find(sep);
  return std::string(at == std::string_view::npos ? s : s.substr(0, at));
}

// s.lstrip(chars) / s.rstrip(chars) / s.strip(chars) for ASCII `chars`.
std::string lstrip(std::string_view s, std::string_view chars) {
  const size_t at = s.find_first_not_of(chars);
  return at == std::string_view::npos ? std::string() : std::string(s.substr(at));
}
std::string rstrip(std::string_view s, std::string_view chars) {
  const size_t at = s.find_last_not_of(chars);
  return at == std::string_view::npos ? std::string() : std::string(s.substr(0, at + 1));
}
std::string strip(std::string_view s, std::string_view chars) { return lstrip(rstrip(s, chars), chars); }

// Jinja's trim filter: Python's str.strip() (Unicode whitespace as str.isspace).
std::string python_strip(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t next = begin;
    if (!is_python_space(utf8_next(s, next))) break;
    begin = next;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t probe = start;
    if (!is_python_space(utf8_next(s, probe))) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

// ---- Template source matching ----

// The source without whitespace and "\n" escapes, with the source offset of each kept byte.
struct Squeezed {
  std::string text;
  std::vector<size_t> origin;
};

Squeezed squeeze(std::string_view source) {
  Squeezed out;
  for (size_t i = 0; i < source.size(); ++i) {
    const char c = source[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (c == '\\' && i + 1 < source.size() && source[i + 1] == 'n') {
      ++i;
      continue;
    }
    out.text += c;
    out.origin.push_back(i);
  }
  return out;
}

std::string squeeze_text(std::string_view s) { return squeeze(s).text; }

// A Jinja string literal's escapes (Python's unicode-escape for the common ones).
std::string unescape_jinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      default: out += '\\'; out += e;
    }
  }
  return out;
}

constexpr std::string_view kQwen3Fragments[] = {
    R"({%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %})",
    R"({%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %})",
    R"({%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %})",
    R"({%- if (message.role == "user") or (message.role == "system" and not loop.first) %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }})",
    R"({%- if message.reasoning_content is defined and message.reasoning_content is not none %})",
    R"({%- set content = message.content.split('</think>')[-1].lstrip('\n') %})",
    R"({%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %})",
    R"({%- if loop.index0 > ns.last_query_index %}{%- if loop.last or (not loop.last and reasoning_content) %}{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }})",
    R"({%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }})",
    R"({%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %})",
};

constexpr std::string_view kQwen25Fragments[] = {
    R"({%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }})",
    R"({%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %})",
    R"({%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})",
};
// The no-tools system block, up to the default prompt, which runs to "<|im_end|>\n' }}".
constexpr std::string_view kQwen25SystemPrefix =
    R"({%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\n)";

constexpr std::string_view kLlama3Fragments[] = {
    R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %})",
};
constexpr std::string_view kLlama3ConditionalPrompt =
    R"({% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";
constexpr std::string_view kLlama3AlwaysPrompt =
    R"({% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }})";

constexpr std::string_view kDeepSeekCommonFragments[] = {
    R"({{bos_token}}{{ns.system_prompt}})",
    R"({%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %})",
    R"({%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %})",
};
constexpr std::string_view kDeepSeekR1Fragments[] = {
    R"({% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %})",
    R"({%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %})",
    R"({% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %})",
};
constexpr std::string_view kDeepSeekV3Fragments[] = {
    R"({% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %})",
    R"({%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}{%- endif %})",
    R"({%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %})",
    R"({% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %})",
};

template <size_t N>
bool has_all(const std::string& squeezed, const std::string_view (&fragments)[N]) {
  for (const std::string_view f : fragments) {
    if (!contains(squeezed, squeeze_text(f))) return false;
  }
  return true;
}

// ---- Renderers ----

void check_not_empty(std::span<const ChatMessage> messages, ChatFamily family) {
  if (messages.empty()) {
    throw ValueError("chat_template", str_cat(ChatTemplate::family_name(family), ": the conversation is empty"));
  }
}

// The tool-result block shared by both Qwen templates.
void qwen_tool(std::string& out, std::span<const ChatMessage> m, size_t i) {
  if (i == 0 || m[i - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
  if (i + 1 == m.size() || m[i + 1].role != "tool") out += "<|im_end|>\n";
}

std::string render_qwen2_5(std::span<const ChatMessage> m, const ChatOptions& options,
                           const std::string& default_system) {
  check_not_empty(m, ChatFamily::qwen2_5);
  std::string out;
  if (m[0].role == "system")
    out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
  else
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string& role = m[i].role;
    if (role == "user" || (role == "system" && i != 0) || role == "assistant") {
      out += "<|im_start|>" + role + "\n" + m[i].content + "<|im_end|>\n";
    } else if (role == "tool") {
      qwen_tool(out, m, i);
    }
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_qwen3(std::span<const ChatMessage> m, const ChatOptions& options) {
  check_not_empty(m, ChatFamily::qwen3);
  std::string out;
  if (m[0].role == "system") out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
  // The last user turn that is not a tool response: reasoning is shown only for turns after it.
  size_t last_query = m.size() - 1;
  for (size_t k = m.size(); k-- > 0;) {
    const std::string& c = m[k].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (m[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    const bool last = i + 1 == m.size();
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    } else if (msg.role == "assistant") {
      std::string content = msg.content, reasoning;
      if (msg.reasoning_content) {
        reasoning = *msg.reasoning_content;
      } else if (contains(msg.content, "</think>")) {
        content = lstrip(after_last(msg.content, "</think>"), "\n");
        reasoning = lstrip(after_last(rstrip(before_first(msg.content, "</think>"), "\n"), "<think>"), "\n");
      }
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>" + msg.role + "\n<think>\n" + strip(reasoning, "\n") + "\n</think>\n\n" +
               lstrip(content, "\n");
      } else {
        out += "<|im_start|>" + msg.role + "\n" + content;
      }
      out += "<|im_end|>\n";
    } else if (msg.role == "tool") {
      qwen_tool(out, m, i);
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string render_deepseek(std::span<const ChatMessage> m, const ChatOptions& options, const std::string& bos,
                            bool r1) {
  std::string system;
  bool first_system = true;
  for (const ChatMessage& msg : m) {
    if (msg.role != "system") continue;
    if (r1)
      system = msg.content;  // R1 keeps the last system message
    else
      system += (first_system ? "" : "\n\n") + msg.content;
    first_system = false;
  }
  std::string out = bos + system;
  bool is_tool = false, is_output_first = true;
  for (const ChatMessage& msg : m) {
    if (msg.role == "user") {
      is_tool = false;
      out += "<｜User｜>" + msg.content;
    } else if (msg.role == "assistant") {
      if (is_tool) {
        out += "<｜tool▁outputs▁end｜>" + msg.content + "<｜end▁of▁sentence｜>";
        is_tool = false;
      } else {
        const std::string content =
            r1 && contains(msg.content, "</think>") ? after_last(msg.content, "</think>") : msg.content;
        out += "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>";
      }
    } else if (msg.role == "tool") {
      is_tool = true;
      if (is_output_first) {
        out += "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" + msg.content + "<｜tool▁output▁end｜>";
        is_output_first = false;
      } else {
        out += "\n<｜tool▁output▁begin｜>" + msg.content + "<｜tool▁output▁end｜>";
      }
    }
  }
  if (is_tool) out += "<｜tool▁outputs▁end｜>";
  if (options.add_generation_prompt && !is_tool) out += r1 ? "<｜Assistant｜><think>\n" : "<｜Assistant｜>";
  return out;
}

std::string render_llama3(std::span<const ChatMessage> m, const ChatOptions& options, const std::string& bos,
                          bool always_prompt) {
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (i == 0) out += bos;
    out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" + python_strip(m[i].content) + "<|eot_id|>";
  }
  if (always_prompt || options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

const char* ChatTemplate::family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::qwen2_5: return "qwen2.5";
    case ChatFamily::qwen3: return "qwen3";
    case ChatFamily::deepseek_r1: return "deepseek-r1";
    case ChatFamily::deepseek_v3: return "deepseek-v3";
    case ChatFamily::llama3: return "llama3";
  }
  return "?";
}

ChatTemplate ChatTemplate::builtin(ChatFamily family, std::string bos_token, std::string eos_token) {
  ChatTemplate t(family, std::move(bos_token), std::move(eos_token));
  t.always_generation_prompt_ = false;
  return t;
}

ChatTemplate ChatTemplate::from_source(std::string_view jinja_source, std::string bos_token, std::string eos_token) {
  const Squeezed s = squeeze(jinja_source);
  if (has_all(s.text, kQwen3Fragments))
    return ChatTemplate(ChatFamily::qwen3, std::move(bos_token), std::move(eos_token));
  if (has_all(s.text, kQwen25Fragments)) {
    const std::string prefix = squeeze_text(kQwen25SystemPrefix);
    const size_t at = s.text.find(prefix);
    const size_t end = at == std::string::npos ? at : s.text.find("<|im_end|>'}}", at + prefix.size());
    if (end != std::string::npos) {
      // The default system prompt, cut from the source itself (its spaces are not in the squeezed text).
      const size_t from = s.origin[at + prefix.size()];
      const size_t to = s.origin[end];
      std::string_view raw = jinja_source.substr(from, to - from);
      if (raw.find('\'') == std::string_view::npos) {
        ChatTemplate t(ChatFamily::qwen2_5, std::move(bos_token), std::move(eos_token));
        t.default_system_ = unescape_jinja(raw);
        return t;
      }
    }
  }
  if (has_all(s.text, kDeepSeekCommonFragments)) {
    if (has_all(s.text, kDeepSeekR1Fragments))
      return ChatTemplate(ChatFamily::deepseek_r1, std::move(bos_token), std::move(eos_token));
    if (has_all(s.text, kDeepSeekV3Fragments))
      return ChatTemplate(ChatFamily::deepseek_v3, std::move(bos_token), std::move(eos_token));
  }
  if (has_all(s.text, kLlama3Fragments)) {
    ChatTemplate t(ChatFamily::llama3, std::move(bos_token), std::move(eos_token));
    if (contains(s.text, squeeze_text(kLlama3ConditionalPrompt))) return t;
    if (s.text.ends_with(squeeze_text(kLlama3AlwaysPrompt))) {
      t.always_generation_prompt_ = true;
      return t;
    }
  }
  std::string start(jinja_source.substr(0, 80));
  for (char& c : start) {
    if (c == '\n') c = ' ';
  }
  throw NotSupportedError("chat_template",
                          str_cat("unknown chat template (it starts \"", start,
                                  "...\"); known families: qwen2.5, qwen3, deepseek-r1, deepseek-v3, llama3"));
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatOptions& options) const {
  switch (family_) {
    case ChatFamily::qwen2_5: return render_qwen2_5(messages, options, default_system_);
    case ChatFamily::qwen3: return render_qwen3(messages, options);
    case ChatFamily::deepseek_r1: return render_deepseek(messages, options, bos_, true);
    case ChatFamily::deepseek_v3: return render_deepseek(messages, options, bos_, false);
    case ChatFamily::llama3: return render_llama3(messages, options, bos_, always_generation_prompt_);
  }
  throw NotSupportedError("chat_template", "unknown family");
}

}  // namespace microllm
