// `microllm tokenize`: text to token ids and back, one JSON value per line.
//   microllm tokenize --tokenizer models/Qwen3-0.6B --input texts.jsonl            # "text" -> [ids]
//   microllm tokenize --tokenizer tokenizer.json --input ids.jsonl --decode        # [ids] -> "text"
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "microllm/core/error.h"
#include "microllm/tokenizer/tokenizer.h"

namespace microllm::app {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string input = "-";
  bool decode = false;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
};

void run_tokenize(const TokenizeOptions& o) {
  const Tokenizer tok = Tokenizer::load(o.tokenizer);
  std::ifstream file;
  if (o.input != "-") {
    file.open(o.input, std::ios::binary);
    if (!file) throw IoError("tokenize", str_cat(o.input, ": cannot open the file"));
  }
  std::istream& in = o.input == "-" ? std::cin : file;
  const std::string name = o.input == "-" ? "<stdin>" : o.input;
  std::string line;
  size_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e309
      throw ParseError("tokenize", str_cat(name, ":", line_number, ": not JSON (", e.what(), ")"));
    }
    if (!o.decode) {
      if (!value.is_string()) throw ParseError("tokenize", str_cat(name, ":", line_number, ": expected a JSON string"));
      std::cout << nlohmann::json(tok.encode(value.get_ref<const std::string&>(), o.add_special_tokens)).dump() << "\n";
    } else {
      if (!value.is_array())
        throw ParseError("tokenize", str_cat(name, ":", line_number, ": expected a JSON array of ids"));
      std::vector<int32_t> ids;
      for (const auto& id : value) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          throw ParseError("tokenize", str_cat(name, ":", line_number, ": ", id.dump(), " is not a token id"));
        }
        ids.push_back(id.get<int32_t>());
      }
      std::cout << nlohmann::json(tok.decode(ids, o.skip_special_tokens)).dump() << "\n";
    }
  }
  std::cout.flush();
}

}  // namespace

void register_tokenize(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("tokenize", "Encode JSON strings to token ids, or decode ids to text (JSON lines)");
  auto o = std::make_shared<TokenizeOptions>();  // outlives this function: the callback runs after parsing
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json, a model directory, or a directory with vocab.json + merges.txt")
      ->required();
  cmd->add_option("--input", o->input, "JSON lines: strings to encode, or id arrays with --decode ('-': stdin)");
  cmd->add_flag("--decode", o->decode, "Decode: each line a JSON array of ids, printed as a JSON string");
  cmd->add_flag("--add-special-tokens", o->add_special_tokens, "Encode with the post-processor's special tokens");
  cmd->add_flag("--skip-special-tokens", o->skip_special_tokens, "Decode without special tokens");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace microllm::app
