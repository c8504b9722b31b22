// The four real tokenizers against the Hugging Face libraries: ids, ids with special tokens and decodes
// of every text in texts.jsonl, from tests/fixtures/tokenizer/golden_<name>.jsonl (written by
// tools/oracle/tokenizer_golden.py). Needs data/tokenizers (scripts/fetch-tokenizers.sh); skips without.
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

TEST_P(TokenizerGolden, MatchesHuggingFace) {
  const std::string name = GetParam();
  const auto dir = tokenizers_data() / name;
  const auto golden = tokenizer_fixtures() / ("golden_" + name + ".jsonl");
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir << ": run scripts/fetch-tokenizers.sh";
  if (!std::filesystem::exists(golden)) {
    GTEST_SKIP() << "no " << golden
                 << ": run tools/oracle/tokenizer_golden.py where tokenizers + transformers are installed";
  }
  const std::vector<std::string> texts = fixture_texts();
  const std::vector<Json> lines = read_json_lines(golden);
  ASSERT_FALSE(lines.empty());
  const Json& meta = lines[0]["meta"];
  // The `tokenizers` reference is tokenizer.json alone; transformers' (hf_*) is the directory with its config.
  const bool has_json = std::filesystem::exists(dir / "tokenizer.json");
  const Tokenizer raw = Tokenizer::load((has_json ? dir / "tokenizer.json" : dir).string());
  const Tokenizer hf = Tokenizer::load(dir.string());
  // transformers disagreeing with tokenizer.json itself (ids without special tokens; "hf_ids" is written
  // where they differ) means that version rebuilds the pipeline from its tokenizer class (transformers 5's
  // LlamaTokenizer over a byte-level vocabulary): then only the `tokenizers` comparisons hold.
  size_t hf_differ = 0;
  for (size_t i = 1; i < lines.size(); ++i)
    hf_differ += lines[i].contains("hf_ids") && lines[i]["hf_ids"] != lines[i]["ids"];
  if (hf_differ > 0) {
    std::cout << "[ golden   ] " << name << ": transformers " << meta["transformers_version"] << " ("
              << meta["hf_class"] << ") differs from tokenizer.json on " << hf_differ
              << " texts: its hf_* results are not compared\n";
  }
  ASSERT_EQ(lines.size(), texts.size() + 1) << golden << " was made from another texts.jsonl";
  ASSERT_EQ(raw.vocab_size(), meta["vocab_size"].get<size_t>())
      << golden << ": the reference had another vocabulary (re-run tools/oracle/tokenizer_golden.py)";

  size_t failures = 0;
  auto check = [&](bool ok, size_t i, const std::string& what, const std::string& detail) {
    if (ok) return;
    if (++failures <= 20)
      ADD_FAILURE() << name << " text " << i << " " << what << ": " << detail << "\n  text: " << Json(texts[i]).dump();
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    const Json& g = lines[i + 1];
    const std::string& text = texts[i];
    const auto ids = raw.encode(text, false), ids_special = raw.encode(text, true);
    const auto want = g["ids"].get<std::vector<int32_t>>(), want_special = g["ids_special"].get<std::vector<int32_t>>();
    check(ids == want, i, "ids", show(ids) + " != " + show(want));
    check(ids_special == want_special, i, "ids_special", show(ids_special) + " != " + show(want_special));
    check(raw.decode(want) == g["decoded"].get<std::string>(), i, "decode", Json(raw.decode(want)).dump());
    check(raw.decode(want_special, true) == g["decoded_skip"].get<std::string>(), i, "decode(skip_special_tokens)",
          Json(raw.decode(want_special, true)).dump());

    if (hf_differ > 0) continue;
    const auto hf_want = g["hf_ids_special"].get<std::vector<int32_t>>();
    const auto hf_ids = hf.encode(text, true);
    check(hf_ids == hf_want, i, "transformers ids", show(hf_ids) + " != " + show(hf_want));
    const std::string hf_decoded = hf.decode(want);
    check(hf_decoded == g["hf_decoded"].get<std::string>(), i, "transformers decode", Json(hf_decoded).dump());
  }
  std::cout << "[ golden   ] " << name << ": " << texts.size() << " texts, " << failures << " mismatches ("
            << meta["source"] << ", tokenizers " << meta["tokenizers_version"] << ", transformers "
            << meta["transformers_version"] << ")\n";
}

INSTANTIATE_TEST_SUITE_P(Real, TokenizerGolden, ::testing::Values("qwen3", "llama3", "deepseek_v3", "gpt2"));

}  // namespace
}  // namespace microllm::testing
