// The chat templates of tests/fixtures/chat_templates (real templates of many model families, from their
// tokenizer_config.json files) rendered over every conversation of their groups, against golden.jsonl: the
// text transformers' apply_chat_template renders (tools/oracle/chat_template_golden.py), byte for byte, or an
// error where transformers raises one.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <set>

#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

std::filesystem::path chat_fixtures() {
  return std::filesystem::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "chat_templates";
}

// strftime_now's clock in the goldens: 2024-07-26 12:00:00.
constexpr int64_t kGoldenNow = 1721995200;

// Ordered: the JSON goes to the template with its keys in file order, as Python's json.load keeps them.
using OrderedJson = nlohmann::ordered_json;

struct Conversation {
  OrderedJson messages, tools, documents, variables;
};

std::map<std::string, Conversation> load_conversations() {
  const OrderedJson groups = OrderedJson::parse(read_file(chat_fixtures() / "conversations.json"));
  std::map<std::string, Conversation> out;
  for (const auto& [group, conversations] : groups.items()) {
    if (group == "tool_sets") continue;
    for (const OrderedJson& c : conversations) {
      Conversation conversation{c["messages"], nullptr, c.value("documents", OrderedJson()),
                                c.value("variables", OrderedJson::object())};
      if (c.contains("tools")) conversation.tools = groups["tool_sets"][c["tools"].get<std::string>()];
      out[c["name"]] = std::move(conversation);
    }
  }
  return out;
}

TEST(ChatTemplateGolden, RealTemplatesRenderAsTransformers) {
  const OrderedJson manifest = OrderedJson::parse(read_file(chat_fixtures() / "templates.json"));
  const std::map<std::string, Conversation> conversations = load_conversations();
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, OrderedJson> special_tokens;
  std::set<std::string> families;
  for (const OrderedJson& t : manifest) {
    const std::string name = t["name"];
    templates.emplace(name, ChatTemplate::from_source(read_file(chat_fixtures() / "templates" / (name + ".jinja"))));
    special_tokens[name] = t["special_tokens"];
    families.insert(t["family"].get<std::string>());
  }
  size_t texts = 0, errors = 0;
  std::map<std::string, size_t> per_template;
  for (const Json& line : read_json_lines(chat_fixtures() / "golden.jsonl")) {
    const std::string name = line["template"], conversation_name = line["conversation"];
    const Conversation& c = conversations.at(conversation_name);
    OrderedJson variables = special_tokens.at(name);
    variables.update(c.variables);
    const ChatTemplateInput input{.messages_json = c.messages.dump(),
                                  .add_generation_prompt = line["add_generation_prompt"].get<bool>(),
                                  .tools_json = c.tools.is_null() ? "" : c.tools.dump(),
                                  .documents_json = c.documents.is_null() ? "" : c.documents.dump(),
                                  .variables_json = variables.dump(),
                                  .now_unix_seconds = kGoldenNow};
    const std::string what =
        str_cat(name, " / ", conversation_name, " / add_generation_prompt=", input.add_generation_prompt);
    const ChatTemplate& chat = templates.at(name);
    if (line.contains("error")) {
      // transformers raises: so must the engine, as a template error, not as something unsupported.
      EXPECT_THROW(chat.render_json(input), ValueError) << what << " (transformers: " << line["error"] << ")";
      ++errors;
      continue;
    }
    try {
      EXPECT_EQ(chat.render_json(input), line["text"].get<std::string>()) << what;
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": " << e.what();
    }
    ++texts;
    ++per_template[name];
  }
  EXPECT_GE(families.size(), 15u);
  for (const auto& [name, chat] : templates)
    EXPECT_GE(per_template[name], 4u) << name << " renders too few conversations";
  std::cout << "[ golden   ] " << templates.size() << " templates of " << families.size() << " families: " << texts
            << " renderings equal transformers', " << errors << " errors as transformers raises\n";
}

}  // namespace
}  // namespace microllm::testing
