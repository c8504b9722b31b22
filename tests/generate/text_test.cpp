// generate() and generate_text() on a tiny random model: max_new_tokens, stop ids (EOS), seeded
// reproducibility, and stop strings that span token boundaries and multi-byte characters.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "generate_test_model.h"
#include "microllm/generate/generate.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

using testing_model::random_prompt;
using testing_model::tiny_config;

// Each id decodes to one of these pieces (whole UTF-8 of 1 to 8 bytes).
const std::vector<std::string> kPieces{"a", "bc", "é", "日本", " ", "😀", "x\n", "üo"};
std::string piece_of(int32_t id) { return kPieces[static_cast<size_t>(id) % kPieces.size()]; }
TextDecoder piece_decoder() { return {[](int32_t id) { return piece_of(id); }, nullptr}; }

size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2; }

struct Fixture {
  uint64_t seed = testing::fresh_seed();
  nn::TransformerLM model{tiny_config(), seed};
  std::vector<int32_t> prompt;
  Fixture() {
    Generator gen(seed + 1);
    prompt = random_prompt(gen, 5, model.config().vocab_size);
  }
};

GenerateOptions greedy(int64_t max_new_tokens) {
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling.temperature = 0;
  return o;
}

TEST(Generate, MaxNewTokens) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  for (int64_t n : {0, 1, 7}) EXPECT_EQ(generate(f.model, f.prompt, greedy(n)).size(), static_cast<size_t>(n));
  const Generation g = generate_text(f.model, f.prompt, greedy(7), piece_decoder());
  EXPECT_EQ(g.tokens.size(), 7u);
  EXPECT_EQ(g.finish_reason, FinishReason::length);
}

TEST(Generate, StopIdsEndGenerationAndAreNotDecoded) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const std::vector<int32_t> free = generate(f.model, f.prompt, greedy(12));
  ASSERT_EQ(free.size(), 12u);
  GenerateOptions options = greedy(12);
  options.stop_ids = {free[5], 1000};
  const size_t first = static_cast<size_t>(std::find(free.begin(), free.end(), free[5]) - free.begin());
  const std::vector<int32_t> stopped = generate(f.model, f.prompt, options);
  EXPECT_EQ(stopped, std::vector<int32_t>(free.begin(), free.begin() + static_cast<int64_t>(first) + 1));
  const Generation g = generate_text(f.model, f.prompt, options, piece_decoder());
  EXPECT_EQ(g.tokens, stopped);
  EXPECT_EQ(g.finish_reason, FinishReason::eos);
  std::string expected;
  for (size_t i = 0; i < first; ++i) expected += piece_of(free[i]);
  EXPECT_EQ(g.text, expected);  // the stop id's own text is not shown
}

TEST(Generate, SameSeedSameSamplesOtherSeedsDiffer) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  GenerateOptions options;
  options.max_new_tokens = 16;
  options.sampling.temperature = 1.5;
  options.sampling.top_p = 0.95;
  std::set<std::vector<int32_t>> distinct;
  for (uint64_t s = 0; s < 4; ++s) {
    options.sampling.seed = f.seed + s;
    const std::vector<int32_t> a = generate(f.model, f.prompt, options);
    EXPECT_EQ(a, generate(f.model, f.prompt, options)) << "seed " << s;
    distinct.insert(a);
  }
  EXPECT_EQ(distinct.size(), 4u);
}

TEST(Generate, StopStringsAcrossTokensAndCharacters) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  std::vector<std::string> streamed;
  const Generation free = generate_text(f.model, f.prompt, greedy(24), piece_decoder(), [&](std::string_view t) {
    streamed.emplace_back(t);
    return true;
  });
  ASSERT_EQ(free.tokens.size(), 24u);
  std::string joined;
  for (const std::string& s : streamed) joined += s;
  EXPECT_EQ(joined, free.text);
  // Stop strings: the last character of token i's text, all of token i + 1's and the first character of
  // token i + 2's; the text ends before its first occurrence, at the token that completed it.
  for (size_t i : {0u, 4u, 11u, 20u}) {
    const std::string a = piece_of(free.tokens[i]), b = piece_of(free.tokens[i + 1]), c = piece_of(free.tokens[i + 2]);
    size_t last = a.size() - 1;
    while ((static_cast<unsigned char>(a[last]) & 0xC0) == 0x80) --last;
    const std::string stop = a.substr(last) + b + c.substr(0, utf8_length(static_cast<unsigned char>(c[0])));
    const size_t at = free.text.find(stop);
    ASSERT_NE(at, std::string::npos);
    size_t completed = 0, bytes = 0;  // the number of tokens whose text first holds the stop string
    while (bytes < at + stop.size()) bytes += piece_of(free.tokens[completed++]).size();
    GenerateOptions options = greedy(24);
    options.stop_strings = {stop, "never-seen"};
    streamed.clear();
    const Generation g = generate_text(f.model, f.prompt, options, piece_decoder(), [&](std::string_view t) {
      streamed.emplace_back(t);
      return true;
    });
    EXPECT_EQ(g.text, free.text.substr(0, at)) << "stop '" << stop << "'";
    EXPECT_EQ(g.finish_reason, FinishReason::stop_string);
    EXPECT_EQ(g.tokens, std::vector<int32_t>(free.tokens.begin(), free.tokens.begin() + static_cast<int64_t>(completed)));
    std::string seen;
    for (const std::string& s : streamed) {
      seen += s;
      EXPECT_EQ(free.text.compare(0, seen.size(), seen), 0) << "streamed text that is not the text's beginning";
    }
    EXPECT_EQ(seen, g.text);
  }
  // A stop string that the text only begins: everything held back is released at the end.
  GenerateOptions options = greedy(24);
  options.stop_strings = {piece_of(free.tokens.back()) + "\x01never"};
  const Generation g = generate_text(f.model, f.prompt, options, piece_decoder());
  EXPECT_EQ(g.text, free.text);
  EXPECT_EQ(g.finish_reason, FinishReason::length);
}

TEST(Generate, TextCallbackStopsAndDecoderFinishIsStreamed) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  int calls = 0;
  const Generation g = generate_text(f.model, f.prompt, greedy(10), piece_decoder(), [&](std::string_view) {
    return ++calls < 3;
  });
  EXPECT_EQ(g.finish_reason, FinishReason::callback);
  EXPECT_EQ(g.tokens.size(), 3u);  // every piece is non-empty, so one call per token
  TextDecoder with_tail{[](int32_t) { return std::string(); }, [] { return std::string("tail"); }};
  const Generation t = generate_text(f.model, f.prompt, greedy(3), with_tail);
  EXPECT_EQ(t.text, "tail");
}

TEST(Generate, StopStringsNeedText) {
  Fixture f;
  GenerateOptions options = greedy(3);
  options.stop_strings = {"x"};
  EXPECT_THROW(generate(f.model, f.prompt, options), ValueError);
  options.stop_strings = {""};
  EXPECT_THROW(generate_text(f.model, f.prompt, options, piece_decoder()), ValueError);
}

}  // namespace
}  // namespace microllm::generate
