// The real tokenizers (and variants of them, variants.json) against the Hugging Face libraries, from
// tests/fixtures/tokenizer/golden_<name>.jsonl:
// ids, ids with special tokens, decodes (whole and streamed token by token) of every text of the golden's
// text files (texts.jsonl, plus texts_byte_fallback.jsonl for the newer goldens), and decodes of the id
// sequences of decode_cases.json. Written by tools/oracle/tokenizer_golden.py (Python tokenizers and
// transformers) or tools/oracle/tokenizer_golden_node.mjs (the same Rust tokenizers through Node.js; no
// transformers results). Needs data/tokenizers (scripts/fetch-tokenizers.sh); skips without.
#include <gtest/gtest.h>

#include <iostream>

#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

std::string show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + (ids.size() > 40 ? ",...]" : "]");
}

// The golden's texts: its text files in order, each cut to meta.texts_lines[file] lines when given.
std::vector<std::string> golden_texts(const Json& meta) {
  std::vector<std::string> texts;
  for (const std::string& file : meta.value("texts_files", std::vector<std::string>{"texts.jsonl"})) {
    std::vector<std::string> part = fixture_texts({file});
    if (meta.contains("texts_lines") && meta["texts_lines"].contains(file))
      part.resize(std::min(part.size(), meta["texts_lines"][file].get<size_t>()));
    texts.insert(texts.end(), part.begin(), part.end());
  }
  return texts;
}

// The `tokenizers` reference is tokenizer.json alone; a variant (variants.json) is its base's tokenizer.json
// with the top-level parts of meta.overrides replaced, and with meta.unigram_from_vocab a Unigram model over
// the BPE vocabulary's pieces (id i scored -(i + 1) / 1000).
Tokenizer reference_tokenizer(const std::filesystem::path& dir, const Json& meta) {
  const bool has_json = std::filesystem::exists(dir / "tokenizer.json");
  if (!meta.contains("overrides")) return Tokenizer::load((has_json ? dir / "tokenizer.json" : dir).string());
  Json json = Json::parse(read_file(dir / "tokenizer.json"));
  for (const auto& [key, value] : meta["overrides"].items()) json[key] = value;
  if (meta.contains("unigram_from_vocab")) {
    Json pieces = Json::array();
    for (const auto& [piece, id] : json["model"]["vocab"].items()) {
      if (pieces.size() <= id.get<size_t>()) pieces.get_ref<Json::array_t&>().resize(id.get<size_t>() + 1);
      pieces[id.get<size_t>()] = Json::array({piece, -(id.get<double>() + 1) / 1000});
    }
    const Json& settings = meta["unigram_from_vocab"];
    json["model"] = {{"type", "Unigram"},
                     {"unk_id", settings["unk_id"]},
                     {"byte_fallback", settings["byte_fallback"]},
                     {"vocab", pieces}};
  }
  return Tokenizer::from_json_text(json.dump(), (dir / "tokenizer.json").string() + " (variant)");
}

TEST_P(TokenizerGolden, MatchesHuggingFace) {
  const std::string name = GetParam();
  const auto golden = tokenizer_fixtures() / ("golden_" + name + ".jsonl");
  if (!std::filesystem::exists(golden)) {
    GTEST_SKIP() << "no " << golden
                 << ": run tools/oracle/tokenizer_golden.py where tokenizers + transformers are installed";
  }
  const std::vector<Json> lines = read_json_lines(golden);
  ASSERT_FALSE(lines.empty());
  const Json& meta = lines[0]["meta"];
  const auto dir = tokenizers_data() / meta.value("base", name);
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir << ": run scripts/fetch-tokenizers.sh";
  const std::vector<std::string> texts = golden_texts(meta);
  const size_t decode_cases = meta.value("decode_cases", size_t{0});
  ASSERT_EQ(lines.size(), 1 + texts.size() + decode_cases) << golden << " was made from other text files";

  const Tokenizer raw = reference_tokenizer(dir, meta);
  ASSERT_EQ(raw.vocab_size(), meta["vocab_size"].get<size_t>())
      << golden << ": the reference had another vocabulary (re-run the oracle)";
  // transformers disagreeing with tokenizer.json itself (ids without special tokens; "hf_ids" is written
  // where they differ) means that version rebuilds the pipeline from its tokenizer class (transformers 5's
  // LlamaTokenizer over a byte-level vocabulary): then only the `tokenizers` comparisons hold.
  bool compare_hf = !meta["hf_class"].is_null() && !meta.contains("overrides");
  if (!compare_hf) {
    std::cout << "[ golden   ] " << name << ": made by " << meta.value("oracle", std::string("?"))
              << " without transformers: its hf_* results are not compared\n";
  }
  size_t hf_differ = 0;
  for (size_t i = 1; i <= texts.size(); ++i)
    hf_differ += lines[i].contains("hf_ids") && lines[i]["hf_ids"] != lines[i]["ids"];
  if (compare_hf && hf_differ > 0) {
    compare_hf = false;
    std::cout << "[ golden   ] " << name << ": transformers " << meta["transformers_version"] << " ("
              << meta["hf_class"] << ") differs from tokenizer.json on " << hf_differ
              << " texts: its hf_* results are not compared\n";
  }
  const std::optional<Tokenizer> hf =
      compare_hf ? std::optional<Tokenizer>(Tokenizer::load(dir.string())) : std::nullopt;

  size_t failures = 0;
  auto check = [&](bool ok, const std::string& what, const std::string& detail, const std::string& input) {
    if (ok) return;
    if (++failures <= 20) ADD_FAILURE() << name << " " << what << ": " << detail << "\n  input: " << input;
  };
  // decode and its streamed twin, with and without skip_special_tokens, against the reference texts.
  auto check_decodes = [&](const std::string& what, const std::vector<int32_t>& ids, const Json& want,
                           const std::vector<int32_t>& ids_skip, const Json& want_skip, const std::string& input) {
    for (const bool skip : {false, true}) {
      const std::vector<int32_t>& decoded_ids = skip ? ids_skip : ids;
      const std::string expected = (skip ? want_skip : want).get<std::string>();
      const std::string label = what + (skip ? " decode(skip_special_tokens)" : " decode");
      const std::string whole = raw.decode(decoded_ids, skip);
      check(whole == expected, label, Json(whole).dump() + " != " + Json(expected).dump(), input);
      const StreamedDecode streamed = stream_decode(raw, decoded_ids, skip);
      check(streamed.text == expected && streamed.pieces_are_utf8, label + " streamed",
            Json(streamed.text).dump() + (streamed.pieces_are_utf8 ? "" : " (a piece is not UTF-8)"), input);
    }
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    const Json& g = lines[i + 1];
    const std::string& text = texts[i];
    const std::string where = "text " + std::to_string(i);
    const auto ids = raw.encode(text, false), ids_special = raw.encode(text, true);
    const auto want = g["ids"].get<std::vector<int32_t>>(), want_special = g["ids_special"].get<std::vector<int32_t>>();
    check(ids == want, where + " ids", show(ids) + " != " + show(want), Json(text).dump());
    check(ids_special == want_special, where + " ids_special", show(ids_special) + " != " + show(want_special),
          Json(text).dump());
    check_decodes(where, want, g["decoded"], want_special, g["decoded_skip"], Json(text).dump());
    if (!hf) continue;
    const auto hf_want = g["hf_ids_special"].get<std::vector<int32_t>>();
    const auto hf_ids = hf->encode(text, true);
    check(hf_ids == hf_want, where + " transformers ids", show(hf_ids) + " != " + show(hf_want), Json(text).dump());
    const std::string hf_decoded = hf->decode(want);
    check(hf_decoded == g["hf_decoded"].get<std::string>(), where + " transformers decode", Json(hf_decoded).dump(),
          Json(text).dump());
  }
  for (size_t i = texts.size() + 1; i < lines.size(); ++i) {
    const Json& g = lines[i];
    const auto ids = g["decode_ids"].get<std::vector<int32_t>>();
    check_decodes("case '" + g["case"].get<std::string>() + "'", ids, g["decoded"], ids, g["decoded_skip"], show(ids));
  }
  std::cout << "[ golden   ] " << name << ": " << texts.size() << " texts, " << decode_cases << " decode cases, "
            << failures << " mismatches (" << meta["source"] << ", tokenizers " << meta["tokenizers_version"]
            << ", transformers " << meta["transformers_version"] << ")\n";
}

INSTANTIATE_TEST_SUITE_P(Real, TokenizerGolden,
                         ::testing::Values("qwen3", "llama3", "deepseek_v3", "gpt2", "llama2", "gemma3", "o200k",
                                           "llama2_metaspace", "llama2_metaspace_split", "llama2_metaspace_never",
                                           "llama2_unigram"));

}  // namespace
}  // namespace microllm::testing
