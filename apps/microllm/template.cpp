// `microllm template`: a model's chat template rendered over a conversation, exactly the text transformers'
// apply_chat_template(..., tokenize=False) gives, for scripts and for checking a template.
//   microllm template --model models/Qwen3-0.6B --messages chat.json --add-generation-prompt --var
//   enable_thinking=false microllm template --model tokenizer-dir --messages chat.json --tools tools.json
// A template the engine cannot parse or render (an unsupported construct) exits with status 2, naming the
// template line and the construct.
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "microllm/core/error.h"
#include "microllm/tokenizer/chat_template.h"

namespace microllm::app {
namespace {

struct TemplateOptions {
  std::string model;
  std::string messages;
  std::string tools;
  std::string documents;
  std::vector<std::string> variables;  // NAME=JSON
  bool add_generation_prompt = false;
};

std::string read_input(const std::string& path) {
  if (path == "-") {
    std::ostringstream text;
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("template", str_cat(path, ": cannot open the file"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// --var NAME=JSON ... as one JSON object; a value that is not JSON is an error naming it.
std::string variables_json(const std::vector<std::string>& variables) {
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  for (const std::string& v : variables) {
    const size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ValueError("template", str_cat("--var ", v, ": expected NAME=JSON (e.g. enable_thinking=false)"));
    }
    try {
      object[v.substr(0, eq)] = nlohmann::ordered_json::parse(v.substr(eq + 1));
    } catch (const nlohmann::json::exception&) {
      throw ValueError(
          "template",
          str_cat("--var ", v, ": the value is not JSON (a string needs quotes: ", v.substr(0, eq), "='\"text\"')"));
    }
  }
  return object.dump();
}

void run_template(const TemplateOptions& o) {
  ChatTemplateInput input{.messages_json = read_input(o.messages),
                          .add_generation_prompt = o.add_generation_prompt,
                          .tools_json = o.tools.empty() ? "" : read_input(o.tools),
                          .documents_json = o.documents.empty() ? "" : read_input(o.documents),
                          .variables_json = variables_json(o.variables)};
  std::string text;
  try {
    text = ChatTemplate::from_directory(o.model, !o.tools.empty()).render_json(input);
  } catch (const NotSupportedError& e) {
    std::cerr << "error: " << e.what() << "\n";
    throw CLI::RuntimeError(2);
  }
  std::cout << text << std::flush;
}

}  // namespace

void register_template(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "template", "Render a model's chat template over a conversation (JSON), as transformers' apply_chat_template");
  auto o = std::make_shared<TemplateOptions>();  // outlives this function: the callback runs after parsing
  cmd->add_option("--model", o->model, "A model or tokenizer folder (chat_template.jinja and/or tokenizer_config.json)")
      ->required();
  cmd->add_option("--messages", o->messages, "JSON file: the messages list as transformers takes it ('-': stdin)")
      ->required();
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "End with the header of the assistant's next turn");
  cmd->add_option("--tools", o->tools, "JSON file: a list of tool schemas (the template's `tools`)");
  cmd->add_option("--documents", o->documents, "JSON file: a list of documents (the template's `documents`)");
  cmd->add_option("--var", o->variables, "NAME=JSON: an extra template variable, e.g. enable_thinking=false")
      ->take_all();
  cmd->callback([o] { run_template(*o); });
}

}  // namespace microllm::app
