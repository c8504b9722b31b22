// Added tokens in the text: longest match at the leftmost position, lstrip/rstrip/single_word, normalized
// tokens matched after normalization, special or not.
#include <gtest/gtest.h>
#include <unistd.h>

#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using Ids = std::vector<int32_t>;

Json with_tokens(Json tokens, Json normalizer = nullptr) {
  Json j = byte_level_json({});
  j["added_tokens"] = std::move(tokens);
  j["normalizer"] = std::move(normalizer);
  return j;
}

Json token(int id, const std::string& content, bool lstrip = false, bool rstrip = false, bool single_word = false,
           bool normalized = false, bool special = true) {
  return {{"id", id},         {"content", content},       {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

TEST(AddedTokens, SplitBeforePreTokenization) {
  const Tokenizer tok = tokenizer_of(with_tokens(Json::array({token(256, "<|im_start|>"), token(257, "<|im_end|>")})));
  EXPECT_EQ(tok.encode("<|im_start|>hi<|im_end|>"), (Ids{256, 'h', 'i', 257}));
  EXPECT_EQ(tok.encode("x <|im_start|> y"), (Ids{'x', 32, 256, 32, 'y'}));
  EXPECT_EQ(tok.encode("<|im_start"), (Ids{'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't'}));
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 257);
  EXPECT_EQ(tok.id_to_token(256), "<|im_start|>");
}

TEST(AddedTokens, LongestMatchWins) {
  const Tokenizer tok =
      tokenizer_of(with_tokens(Json::array({token(256, "<a>"), token(257, "<a><b>"), token(258, "b>")})));
  EXPECT_EQ(tok.encode("<a><b>"), (Ids{257}));
  EXPECT_EQ(tok.encode("<a><b"), (Ids{256, '<', 'b'}));
  EXPECT_EQ(tok.encode("x<a>b>"), (Ids{'x', 256, 258}));
}

TEST(AddedTokens, LstripAndRstripTakeTheSpaces) {
  const Tokenizer tok =
      tokenizer_of(with_tokens(Json::array({token(256, "<m>", true, false), token(257, "<n>", false, true)})));
  EXPECT_EQ(tok.encode("a  <m>b"), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(tok.encode("a<n>  b"), (Ids{'a', 257, 'b'}));
  EXPECT_EQ(tok.encode("a <n> <m> b"), (Ids{'a', 32, 257, 256, 32, 'b'}));
}

TEST(AddedTokens, SingleWordOnlyBetweenNonWordCharacters) {
  const Tokenizer tok = tokenizer_of(with_tokens(Json::array({token(256, "ab", false, false, true, false, false)})));
  EXPECT_EQ(tok.encode("ab"), (Ids{256}));
  EXPECT_EQ(tok.encode("ab cab abc ab."), (Ids{256, 32, 'c', 'a', 'b', 32, 'a', 'b', 'c', 32, 256, '.'}));
}

TEST(AddedTokens, NormalizedTokensMatchNormalizedText) {
  // "<é>" (é precomposed) as a normalized token matches the decomposed input after NFC; a non-normalized
  // "<e\u0301>" token matches only the raw decomposed text, before normalization.
  const std::string composed = "<\xC3\xA9>", decomposed = "<e\xCC\x81>";
  const Tokenizer tok = tokenizer_of(
      with_tokens(Json::array({token(256, composed, false, false, false, true, false)}), {{"type", "NFC"}}));
  EXPECT_EQ(tok.encode(decomposed), (Ids{256}));
  EXPECT_EQ(tok.encode(composed), (Ids{256}));
  const Tokenizer raw = tokenizer_of(
      with_tokens(Json::array({token(256, decomposed, false, false, false, false, false)}), {{"type", "NFC"}}));
  EXPECT_EQ(raw.encode(decomposed), (Ids{256}));
  EXPECT_EQ(raw.encode(composed), (Ids{'<', 0xC3, 0xA9, '>'}));
}

TEST(AddedTokens, IdsFollowTheModelVocabulary) {
  // An added token already in the vocabulary keeps its id there; new ones follow the vocabulary.
  const Tokenizer tok = tokenizer_of(with_tokens(Json::array({token(5, "a"), token(300, "<x>"), token(301, "<y>")})));
  EXPECT_EQ(tok.token_to_id("a"), 'a');
  EXPECT_EQ(tok.token_to_id("<x>"), 256);
  EXPECT_EQ(tok.token_to_id("<y>"), 257);
  EXPECT_EQ(tok.vocab_size(), 258u);
}

TEST(AddedTokens, EmptyTextAndOnlyTokens) {
  const Tokenizer tok = tokenizer_of(with_tokens(Json::array({token(256, "<s>")})));
  EXPECT_EQ(tok.encode(""), Ids{});
  EXPECT_EQ(tok.encode("<s><s>"), (Ids{256, 256}));
  EXPECT_EQ(tok.decode(Ids{}), "");
}


TEST(AddedTokens, StopIdsAreTheEosAndForChatTheEndOfTurnTokens) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("microllm-stop-ids-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_FALSE(Tokenizer::load_if_present(dir.string()).has_value());  // no tokenizer files: bytes

  std::ofstream(dir / "tokenizer.json")
      << with_tokens(Json::array({token(256, "<|endoftext|>"), token(257, "<|im_end|>")})).dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|endoftext|>"})";
  const std::optional<Tokenizer> tok = Tokenizer::load_if_present(dir.string());
  ASSERT_TRUE(tok.has_value());
  EXPECT_EQ(tok->stop_ids(/*chat=*/false), (Ids{256}));
  EXPECT_EQ(tok->stop_ids(/*chat=*/true), (Ids{256, 257}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace microllm::testing
