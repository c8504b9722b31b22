// Hand-checked tokenizations of small tokenizer.json files built in the test: merge order, ties, caches,
// ignore_merges, unknown tokens, byte fallback, pre-tokenizer behaviors and post-processor templates.
#include <gtest/gtest.h>

#include <thread>

#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using Ids = std::vector<int32_t>;

TEST(Bpe, LowestRankMergesFirst) {
  // "abc": (b,c) has rank 0 and (a,b) rank 1, so b+c merges first and "abc" is never reached.
  Json j = char_level_json({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "ab c"});
  EXPECT_EQ(tokenizer_of(j).encode("abc"), (Ids{0, 4}));
  j = char_level_json({"a", "b", "c", "ab", "bc", "abc"}, {"a b", "b c", "ab c"});
  EXPECT_EQ(tokenizer_of(j).encode("abc"), (Ids{5}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  const Tokenizer tok = tokenizer_of(char_level_json({"a", "aa"}, {"a a"}));
  EXPECT_EQ(tok.encode("aaa"), (Ids{1, 0}));
  EXPECT_EQ(tok.encode("aaaa"), (Ids{1, 1}));
  EXPECT_EQ(tok.encode("aaaaa"), (Ids{1, 1, 0}));
}

TEST(Bpe, MergesChainAcrossNewPairs) {
  // After "a b" the new pair (ab, c) becomes available, then (abc, d).
  const Tokenizer tok =
      tokenizer_of(char_level_json({"a", "b", "c", "d", "ab", "abc", "abcd", "cd"}, {"a b", "ab c", "abc d", "c d"}));
  EXPECT_EQ(tok.encode("abcd"), (Ids{6}));
  EXPECT_EQ(tok.encode("dabcd"), (Ids{3, 6}));
}

TEST(Bpe, MergesAsPairsOrStrings) {
  Json j = char_level_json({"a", "b", "ab"}, {});
  j["model"]["merges"] = Json::array({Json::array({"a", "b"})});
  EXPECT_EQ(tokenizer_of(j).encode("ab"), (Ids{2}));
}

TEST(Bpe, LongWordIsFastAndCached) {
  // 20000 symbols merging pairwise: quadratic merging would take seconds here.
  const Tokenizer tok = tokenizer_of(char_level_json({"a", "aa", "aaaa"}, {"a a", "aa aa"}));
  const std::string word(20000, 'a');
  const Ids ids = tok.encode(word);
  ASSERT_EQ(ids.size(), 5000u);
  for (const int32_t id : ids) ASSERT_EQ(id, 2);
  EXPECT_EQ(tok.encode("aaaaaa"), (Ids{2, 1}));
  EXPECT_EQ(tok.encode("aaaaaa"), (Ids{2, 1}));  // from the cache
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  // "abc" is in the vocabulary but no merge sequence makes it.
  Json j = char_level_json({"a", "b", "c", "ab", "abc"}, {"a b"});
  EXPECT_EQ(tokenizer_of(j).encode("abc"), (Ids{3, 2}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(tokenizer_of(j).encode("abc"), (Ids{4}));
  EXPECT_EQ(tokenizer_of(j).encode("cab"), (Ids{2, 3}));
}

TEST(Bpe, UnknownCharacters) {
  Json j = char_level_json({"<unk>", "a", "b"}, {});
  EXPECT_EQ(tokenizer_of(j).encode("axxb"), (Ids{1, 2})) << "without unk_token, unknown characters are dropped";
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(tokenizer_of(j).encode("axxb"), (Ids{1, 0, 0, 2}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(tokenizer_of(j).encode("axxbx"), (Ids{1, 0, 2, 0}));
}

TEST(Bpe, ByteFallback) {
  Json j = char_level_json({"a", "<0xC3>", "<0xA9>"}, {});
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(tokenizer_of(j).encode("a\xC3\xA9"), (Ids{0, 1, 2}));
}

TEST(Bpe, ContinuingSubwordPrefixAndSuffix) {
  Json j = char_level_json({"a", "##b", "##c", "a##b", "ab"}, {});
  j["model"]["continuing_subword_prefix"] = "##";
  j["model"]["merges"] = Json::array({"a ##b"});
  EXPECT_EQ(tokenizer_of(j).encode("abc"), (Ids{4, 2}));  // "a" + "##b" merges into "ab" (prefix dropped)
  Json k = char_level_json({"a", "b</w>", "ab</w>"}, {"a b</w>"});
  k["model"]["end_of_word_suffix"] = "</w>";
  EXPECT_EQ(tokenizer_of(k).encode("ab"), (Ids{2}));
}

TEST(Bpe, ByteLevelEncodesSpacesAndBytes) {
  const std::string G = byte_char(' ');  // "Ġ"
  const Tokenizer tok = tokenizer_of(byte_level_json({{"h", "i"}, {G, "hi"}}));
  // "hi hi": GPT-2's regex makes "hi" and " hi"; " hi" is "Ġhi".
  EXPECT_EQ(tok.encode("hi hi"), (Ids{256, 257}));
  EXPECT_EQ(tok.decode(Ids{256, 257}), "hi hi");
  EXPECT_EQ(tok.encode("\n"), (Ids{10}));
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{0xC3, 0xA9}));  // é as its two bytes
  EXPECT_EQ(tok.id_to_token(32), G);
  EXPECT_EQ(tok.token_to_id(G + "hi"), 257);
  EXPECT_EQ(tok.vocab_size(), 258u);
}

TEST(Bpe, ByteLevelPrefixSpace) {
  Json j = byte_level_json({});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(tokenizer_of(j).encode("a"), (Ids{32, 'a'}));
  EXPECT_EQ(tokenizer_of(j).encode(" a"), (Ids{32, 'a'}));
}

TEST(PreTokenizer, SplitBehaviors) {
  // A vocabulary of single characters, so each piece shows up as its characters; pieces are visible
  // through ignore_merges: a whole piece in the vocabulary is one id.
  auto tok_with = [](const std::string& behavior, bool invert) {
    Json j = char_level_json({"a", "b", "-", "a-", "-b", "-a", "b-", "--", "a--"}, {});
    j["model"]["ignore_merges"] = true;
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return tokenizer_of(j);
  };
  EXPECT_EQ(tok_with("Removed", false).encode("a-b"), (Ids{0, 1}));
  EXPECT_EQ(tok_with("Isolated", false).encode("a-b"), (Ids{0, 2, 1}));
  EXPECT_EQ(tok_with("MergedWithPrevious", false).encode("a-b"), (Ids{3, 1}));
  EXPECT_EQ(tok_with("MergedWithNext", false).encode("a-b"), (Ids{0, 4}));
  EXPECT_EQ(tok_with("Contiguous", false).encode("a--b"), (Ids{0, 7, 1}));
  EXPECT_EQ(tok_with("Removed", true).encode("a-b"), (Ids{2}));  // invert: the non-matches are removed
}

TEST(PreTokenizer, RegexSplitIsolatesMatches) {
  Json j = byte_level_json({}, false);
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["model"]["ignore_merges"] = true;
  j["model"]["vocab"]["123"] = 300;
  j["model"]["vocab"]["45"] = 301;
  EXPECT_EQ(tokenizer_of(j).encode("12345"), (Ids{300, 301}));
}

TEST(PreTokenizer, Digits) {
  Json j = char_level_json({"1", "2", "a", "12"}, {});
  j["model"]["ignore_merges"] = true;
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_EQ(tokenizer_of(j).encode("a12"), (Ids{2, 0, 1}));
  j["pre_tokenizer"]["individual_digits"] = false;
  EXPECT_EQ(tokenizer_of(j).encode("a12"), (Ids{2, 3}));
}

TEST(Normalizer, NfcAndSequence) {
  Json j = char_level_json({"\xC3\xA9", "e", "\xCC\x81", "x"}, {});  // é, e, combining acute, x
  EXPECT_EQ(tokenizer_of(j).encode("e\xCC\x81"), (Ids{1, 2}));
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(tokenizer_of(j).encode("e\xCC\x81"), (Ids{0}));
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       Json::array({{{"type", "NFD"}}, {{"type", "Replace"}, {"pattern", {{"String", "e"}}}, {"content", "x"}}})}};
  EXPECT_EQ(tokenizer_of(j).encode("\xC3\xA9"), (Ids{3, 2}));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array()}};
  EXPECT_EQ(tokenizer_of(j).encode("e"), (Ids{1}));
}

TEST(PostProcessor, TemplateAddsSpecialTokensOnlyWhenAsked) {
  Json j = byte_level_json({});
  j["added_tokens"] = Json::array({added_token(256, "<bos>"), added_token(257, "<eos>")});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                 {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}})},
                         {"pair", Json::array()},
                         {"special_tokens",
                          {{"<bos>", {{"id", "<bos>"}, {"ids", {256}}, {"tokens", {"<bos>"}}}},
                           {"<eos>", {{"id", "<eos>"}, {"ids", {257}}, {"tokens", {"<eos>"}}}}}}};
  const Tokenizer tok = tokenizer_of(j);
  EXPECT_EQ(tok.encode("a"), (Ids{'a'}));
  EXPECT_EQ(tok.encode("a", true), (Ids{256, 'a', 257}));
  EXPECT_EQ(tok.encode("", true), (Ids{256, 257}));
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.decode(Ids{256, 'a', 257}), "<bos>a<eos>");
  EXPECT_EQ(tok.decode(Ids{256, 'a', 257}, true), "a");
  // A Sequence of ByteLevel then the template, as Meta's Llama 3 tokenizer.json has it.
  Json seq = j;
  seq["post_processor"] = {{"type", "Sequence"},
                           {"processors", Json::array({{{"type", "ByteLevel"}}, j["post_processor"]})}};
  EXPECT_EQ(tokenizer_of(seq).encode("a", true), (Ids{256, 'a', 257}));
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const std::string G = byte_char(' ');
  const Tokenizer tok = tokenizer_of(byte_level_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {G, "w"}}));
  const std::string text = "hello world hello there, hello again and hello once more";
  const Ids expected = tok.encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) ok[t] += tok.encode(text) == expected;
    });
  }
  for (auto& th : threads) th.join();
  for (const int n : ok) EXPECT_EQ(n, 200);
}

}  // namespace
}  // namespace microllm::testing
