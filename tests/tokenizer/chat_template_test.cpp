// Chat templates: hand-checked renderings, errors that name the template line, the JSON rendering API, and the
// golden renderings and token ids of tests/fixtures/tokenizer/golden_chat.jsonl (with the fetched tokenizers).
#include <gtest/gtest.h>

#include <iostream>
#include <map>

#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using ::testing::HasSubstr;

std::string template_file(const std::string& name) {
  std::string text = read_file(tokenizer_fixtures() / "templates" / name);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

ChatTemplate chat_fixture(const std::string& name, std::string bos = "", std::string eos = "") {
  const auto path = std::filesystem::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "chat_templates" / "templates" /
                    (name + ".jinja");
  return ChatTemplate::from_source(read_file(path), std::move(bos), std::move(eos));
}

TEST(ChatTemplate, Qwen25) {
  const ChatTemplate t = ChatTemplate::from_source(template_file("qwen2.5-instruct.jinja"));
  EXPECT_EQ(t.render({{"user", "Hello!"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, {.add_generation_prompt = false}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n");
  // An empty conversation: the template reads messages[0]['role'] of an empty list.
  EXPECT_THAT(testing::thrown_message<ValueError>([&] { t.render(std::vector<ChatMessage>{}); }),
              HasSubstr("'list object' has no element 0"));
}

TEST(ChatTemplate, Qwen3Thinking) {
  const ChatTemplate t = chat_fixture("qwen3");
  EXPECT_TRUE(t.reads_variable("enable_thinking"));
  EXPECT_FALSE(ChatTemplate::from_source(template_file("qwen2.5-instruct.jinja")).reads_variable("enable_thinking"));
  EXPECT_EQ(t.render({{"user", "Hi"}}, {.enable_thinking = false}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(t.render({{"user", "Hi"}}, {.enable_thinking = true}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // Reasoning of earlier turns is dropped; the last turn after the last question keeps it.
  const std::vector<ChatMessage> history{{"user", "q"}, {"assistant", "<think>\nr\n</think>\n\na"}, {"user", "q2"}};
  EXPECT_EQ(t.render(history),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> last{{"user", "q"}, {"assistant", "<think>\nr\n</think>\n\na"}};
  EXPECT_EQ(t.render(last, {.add_generation_prompt = false}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n");
  const std::vector<ChatMessage> given{{"user", "q"}, {"assistant", "a", "because"}};
  EXPECT_EQ(t.render(given, {.add_generation_prompt = false}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nbecause\n</think>\n\na<|im_end|>\n");
}

TEST(ChatTemplate, DeepSeekR1AndLlama3) {
  const ChatTemplate r1 =
      ChatTemplate::from_source(template_file("deepseek-r1-distill-qwen.jinja"), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(r1.render({{"system", "S"}, {"user", "Hi"}, {"assistant", "<think>x</think>Yo"}, {"user", "Again"}}),
            "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>Yo<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜><"
            "think>\n");
  const ChatTemplate llama = chat_fixture("llama3-instruct", "<|begin_of_text|>");
  EXPECT_EQ(
      llama.render({{"system", " S \n"}, {"user", "Hi"}}),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, EditedTemplatesRenderAsWritten) {
  // A fine-tune's edited template (another default system prompt) renders with its own text.
  std::string variant = template_file("qwen2.5-instruct.jinja");
  const std::string prompt = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  for (size_t at = variant.find(prompt); at != std::string::npos; at = variant.find(prompt))
    variant.replace(at, prompt.size(), "Please reason step by step.");
  EXPECT_EQ(ChatTemplate::from_source(variant).render({{"user", "x"}}),
            "<|im_start|>system\nPlease reason step by "
            "step.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
  // Any template renders, not only known families.
  EXPECT_EQ(ChatTemplate::from_source("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
                .render({{"user", "a"}, {"assistant", "b"}}),
            "[user] a\n[assistant] b\n");
}

TEST(ChatTemplate, UnsupportedConstructsNameTheLine) {
  EXPECT_THAT(testing::thrown_message<NotSupportedError>(
                  [] { ChatTemplate::from_source("{{ bos_token }}\n{% include 'other.jinja' %}"); }),
              HasSubstr("[chat_template] line 2, column 4: the '{% include %}' statement is not supported"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([] {
                ChatTemplate::from_source("{%- for m in messages %}\n  {{- m.content | wordwrap(10) }}{% endfor %}");
              }),
              HasSubstr("line 2, column 19: the filter 'wordwrap' is not supported"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([] {
                ChatTemplate::from_source("{{ messages[0].content.zfill(3) }}").render({{"user", "7"}});
              }),
              HasSubstr("line 1, column 23: the string method 'zfill' is not supported"));
  EXPECT_THAT(testing::thrown_message<ParseError>([] { ChatTemplate::from_source("{% if x %}no end"); }),
              HasSubstr("line 1, column 4: '{% if %}' is never closed (expected '{% endif %}')"));
  EXPECT_THAT(testing::thrown_message<ValueError>([] {
                ChatTemplate::from_source("{{ raise_exception('Only user and assistant roles are supported!') }}")
                    .render({{"user", "x"}});
              }),
              HasSubstr("line 1, column 4: Only user and assistant roles are supported!"));
}

TEST(ChatTemplate, RendersJsonMessagesToolsAndVariables) {
  const ChatTemplate t = ChatTemplate::from_source(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content if m.content is string else m.content | tojson "
      "}}"
      "{% if m.tool_calls %} calls {{ m.tool_calls[0].function | tojson }}{% endif %}\n{% endfor %}"
      "{% if tools %}tools={{ tools | map(attribute='function.name') | join(',') }}{% endif %}"
      "{{ ' extra=' ~ flavour if flavour is defined }}{{ ' prompt' if add_generation_prompt }}",
      "<s>");
  const std::string messages = R"([{"role": "user", "content": [{"type": "text", "text": "é"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.5}}}]}])";
  EXPECT_EQ(t.render_json({.messages_json = messages,
                           .add_generation_prompt = true,
                           .tools_json = R"([{"function": {"name": "f"}}, {"function": {"name": "g"}}])",
                           .variables_json = R"({"flavour": "mint"})"}),
            "<s>user:[{\"type\": \"text\", \"text\": \"é\"}]assistant:null calls {\"name\": \"f\", \"arguments\": "
            "{\"x\": 1.5}}tools=f,g extra=mint prompt");
  EXPECT_THROW(t.render_json({.messages_json = "{\"role\": \"user\"}"}), ParseError);
  EXPECT_THROW(t.render_json({.messages_json = "[", .add_generation_prompt = false}), ParseError);
}

TEST(ChatTemplate, TokenizerConfigTemplates) {
  const auto data = tokenizers_data();
  if (!std::filesystem::exists(data / "qwen3")) GTEST_SKIP() << "no " << data << ": run scripts/fetch-tokenizers.sh";
  for (const char* name : {"qwen3", "llama3", "deepseek_v3"}) {
    const ChatTemplate chat = Tokenizer::load((data / name).string()).chat_template();
    EXPECT_THAT(chat.render({{"user", "Hello!"}}), HasSubstr("Hello!")) << name;
  }
}

// ---- golden renderings ----

TEST(ChatTemplateGolden, MatchesTransformers) {
  const auto golden = tokenizer_fixtures() / "golden_chat.jsonl";
  if (!std::filesystem::exists(golden)) {
    GTEST_SKIP() << "no " << golden << ": run tools/oracle/tokenizer_golden.py where transformers is installed";
  }
  const Json conversations = Json::parse(read_file(tokenizer_fixtures() / "conversations.json"));
  auto conversation = [&](const std::string& name) {
    std::vector<ChatMessage> messages;
    for (const Json& c : conversations) {
      if (c["name"] != name) continue;
      for (const Json& m : c["messages"]) {
        ChatMessage msg{m["role"], m["content"]};
        if (m.contains("reasoning_content")) msg.reasoning_content = m["reasoning_content"].get<std::string>();
        messages.push_back(std::move(msg));
      }
    }
    return messages;
  };
  std::map<std::string, Tokenizer> tokenizers;
  std::map<std::string, std::string> config_templates;
  size_t checked = 0, skipped = 0, token_checks = 0;
  for (const Json& line : read_json_lines(golden)) {
    const std::string file = line["template_file"];
    std::string source;
    const std::string tok_name = line["tokenizer"];
    const auto tok_dir = tokenizers_data() / tok_name;
    if (file.rfind("data:", 0) == 0) {
      if (!std::filesystem::exists(tok_dir)) {
        ++skipped;
        continue;
      }
      auto it = config_templates.find(tok_name);
      if (it == config_templates.end()) {
        it = config_templates.emplace(tok_name, *Tokenizer::load(tok_dir.string()).chat_template_source()).first;
      }
      source = it->second;
    } else {
      source = template_file(file.substr(std::string("templates/").size()));
    }
    const auto str_or_empty = [](const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); };
    const ChatTemplate t =
        ChatTemplate::from_source(source, str_or_empty(line["bos_token"]), str_or_empty(line["eos_token"]));
    ChatOptions options{.add_generation_prompt = line["add_generation_prompt"].get<bool>()};
    if (line["enable_thinking"].is_boolean()) options.enable_thinking = line["enable_thinking"].get<bool>();
    const std::string what =
        str_cat(line["template"].get<std::string>(), " / ", line["conversation"].get<std::string>(),
                " / add_generation_prompt=", options.add_generation_prompt,
                " / enable_thinking=", line["enable_thinking"].dump());
    const std::vector<ChatMessage> messages = conversation(line["conversation"]);
    if (line.contains("error")) {
      EXPECT_ANY_THROW(t.render(messages, options)) << what << " (transformers: " << line["error"] << ")";
      continue;
    }
    const std::string rendered = t.render(messages, options);
    EXPECT_EQ(rendered, line["text"].get<std::string>()) << what;
    ++checked;
    // The rendered prompt's ids, special tokens written in it included.
    if (std::filesystem::exists(tok_dir / "tokenizer.json")) {
      auto it = tokenizers.find(tok_name);
      if (it == tokenizers.end())
        it = tokenizers.emplace(tok_name, Tokenizer::load((tok_dir / "tokenizer.json").string())).first;
      EXPECT_EQ(it->second.encode(line["text"].get<std::string>()), line["ids"].get<std::vector<int32_t>>()) << what;
      ++token_checks;
    }
  }
  RecordProperty("renderings", static_cast<int>(checked));
  std::cout << "[ golden   ] " << checked << " renderings, " << token_checks << " encoded, " << skipped
            << " skipped (no data/tokenizers)\n";
}

}  // namespace
}  // namespace microllm::testing
