// Bad input is an exception that names the file and the field, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using ::testing::HasSubstr;

std::string parse_error_text(const std::string& text) {
  return testing::thrown_message<ParseError>([&] { (void)Tokenizer::from_json_text(text, "tok/tokenizer.json"); });
}
std::string parse_error(const Json& json) { return parse_error_text(json.dump()); }

TEST(TokenizerErrors, MalformedJson) {
  EXPECT_THAT(parse_error_text("{\"model\": "), HasSubstr("[tokenizer] tok/tokenizer.json: malformed JSON at byte"));
  EXPECT_THAT(parse_error_text("[1, 2]"),
              HasSubstr("tok/tokenizer.json: the top level is not an object (it is an array)"));
  EXPECT_THAT(parse_error_text(""), HasSubstr("malformed JSON"));
  EXPECT_THAT(parse_error_text("{\"model\": \"\xFF\"}"), HasSubstr("malformed JSON"));
  // Found by the fuzzer: a number too large for a double is nlohmann's out_of_range, not a parse_error.
  EXPECT_THAT(parse_error_text("7e7878A"),
              HasSubstr("tok/tokenizer.json: malformed JSON: number overflow parsing '7e7878'"));
}

TEST(TokenizerErrors, MissingAndMistypedFields) {
  EXPECT_THAT(parse_error(Json{{"version", "1.0"}}), HasSubstr("tok/tokenizer.json: model is missing"));
  EXPECT_THAT(parse_error(Json{{"model", {{"type", "BPE"}}}}), HasSubstr("model.vocab is missing"));
  EXPECT_THAT(parse_error(Json{{"model", {{"vocab", {1, 2}}}}}),
              HasSubstr("model.vocab is not an object (it is an array)"));
  EXPECT_THAT(parse_error(Json{{"model", {{"vocab", {{"a", "zero"}}}}}}),
              HasSubstr("model.vocab[\"a\"] is not an integer (it is a string)"));
  EXPECT_THAT(parse_error(Json{{"model", {{"vocab", {{"a", -1}}}}}}),
              HasSubstr("model.vocab[\"a\"] is not a valid token id (-1)"));
  EXPECT_THAT(parse_error(Json{{"model", {{"vocab", {{"a", 1e20}}}}}}),
              HasSubstr("model.vocab[\"a\"] is not an integer (it is a number)"));

  Json j = char_level_json({"a", "b", "ab"}, {"a b"});
  j["model"]["merges"] = Json::array({"a b", "a b", Json::array({"a", 5})});
  EXPECT_THAT(parse_error(j), HasSubstr("tok/tokenizer.json: model.merges[2] is not a string or a pair"));
  j["model"]["merges"] = Json::array({12});
  EXPECT_THAT(parse_error(j), HasSubstr("model.merges[0] is not a string or a pair"));
  j["model"]["merges"] = Json::array({"a b c"});
  EXPECT_THAT(parse_error(j), HasSubstr("model.merges[0] is not two tokens separated by one space"));
  j["model"]["merges"] = Json::array({"a x"});
  EXPECT_THAT(parse_error(j), HasSubstr("model.merges[0] names 'x', which is not in the vocabulary"));
  j["model"]["merges"] = Json::array({"b a"});
  EXPECT_THAT(parse_error(j), HasSubstr("model.merges[0] makes 'ba', which is not in the vocabulary"));
  j["model"]["merges"] = "a b";
  EXPECT_THAT(parse_error(j), HasSubstr("model.merges is not an array (it is a string)"));

  j = char_level_json({"a"}, {});
  j["model"]["ignore_merges"] = "yes";
  EXPECT_THAT(parse_error(j), HasSubstr("model.ignore_merges is not a boolean (it is a string)"));

  j = char_level_json({"a"}, {});
  j["added_tokens"] = Json::array({added_token(1, "<s>"), {{"id", 2}, {"special", true}}});
  EXPECT_THAT(parse_error(j), HasSubstr("added_tokens[1].content is missing"));
  j["added_tokens"] = Json::array({{{"id", "2"}, {"content", "x"}}});
  EXPECT_THAT(parse_error(j), HasSubstr("added_tokens[0].id is not an integer (it is a string)"));
}

TEST(TokenizerErrors, Components) {
  Json j = char_level_json({"a"}, {});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}})}};
  EXPECT_THAT(parse_error(j),
              HasSubstr("tok/tokenizer.json: pre_tokenizer.pretokenizers[0].pattern bad regex '(unclosed'"));
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  EXPECT_THAT(parse_error(j), HasSubstr("pre_tokenizer.behavior is not a split behavior ('Sideways'"));
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Glob", "a"}}}, {"behavior", "Isolated"}};
  EXPECT_THAT(parse_error(j), HasSubstr("pre_tokenizer.pattern has neither 'String' nor 'Regex'"));
  j["pre_tokenizer"] = {{"pattern", "a"}};
  EXPECT_THAT(parse_error(j), HasSubstr("pre_tokenizer.type is missing"));
  j.erase("pre_tokenizer");
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}}}}})},
                         {"special_tokens", Json::object()}};
  EXPECT_THAT(parse_error(j), HasSubstr("post_processor.single[0].SpecialToken names the special token '<s>', which "
                                        "post_processor.special_tokens lacks"));

  // Nesting deep enough to exhaust a recursive parser is refused.
  Json deep = {{"type", "NFC"}};
  for (int i = 0; i < 100; ++i) deep = {{"type", "Sequence"}, {"normalizers", Json::array({deep})}};
  j = char_level_json({"a"}, {});
  j["normalizer"] = deep;
  EXPECT_THAT(parse_error(j), HasSubstr("is nested too deeply"));
}

TEST(TokenizerErrors, UnsupportedComponentsSayWhich) {
  Json j = char_level_json({"a"}, {});
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { tokenizer_of(j); }),
              HasSubstr("model.type: the model 'WordPiece' is not supported"));
  j = char_level_json({"a"}, {});
  j["normalizer"] = {{"type", "Precompiled"}};
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { tokenizer_of(j); }),
              HasSubstr("tokenizer.json: normalizer.type: the normalizer 'Precompiled' is not supported"));
  j = char_level_json({"a"}, {});
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { tokenizer_of(j); }),
              HasSubstr("decoder.type: the decoder 'WordPiece'"));
  j = char_level_json({"a"}, {});
  j["model"]["dropout"] = 0.1;
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { tokenizer_of(j); }), HasSubstr("BPE dropout"));
}

TEST(TokenizerErrors, EncodeRejectsInvalidUtf8) {
  const Tokenizer tok = tokenizer_of(byte_level_json({}));
  EXPECT_THAT(testing::thrown_message<ValueError>([&] { tok.encode("ab\xFF"); }), HasSubstr("not UTF-8 (byte 2)"));
}

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("microllm_tok_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  std::filesystem::path dir_;
};

TEST_F(TokenizerFiles, MissingPathsAreIoErrors) {
  EXPECT_THAT(testing::thrown_message<IoError>([&] { Tokenizer::load((dir_ / "nope").string()); }),
              HasSubstr("nope: no such file or directory"));
  EXPECT_THAT(testing::thrown_message<IoError>([&] { Tokenizer::load(dir_.string()); }),
              HasSubstr("has no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe"));
}

TEST_F(TokenizerFiles, VocabAndMergesFiles) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["he"] = 256;
  vocab["<|endoftext|>"] = 257;
  write("vocab.json", vocab.dump());
  write("merges.txt", "#version: 0.2\nh e\n");
  const Tokenizer tok = Tokenizer::load(dir_.string());
  EXPECT_EQ(tok.encode("hehe<|endoftext|>"), (std::vector<int32_t>{256, 256, 257}));
  EXPECT_EQ(tok.eos_id(), 257);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{256, 257}, true), "he");
  write("merges.txt", "#version: 0.2\nh e\nbad-line\n");
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { Tokenizer::load(dir_.string()); }),
              HasSubstr("merges.txt:3: 'bad-line' is not two tokens separated by one space"));
  write("merges.txt", "h zz\n");
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { Tokenizer::load(dir_.string()); }),
              HasSubstr("merges.txt: merge 1 names 'zz', which is not in the vocabulary"));
  write("merges.txt", "h e\n");
  write("vocab.json", "{\"a\": true}");
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { Tokenizer::load(dir_.string()); }),
              HasSubstr("vocab.json: [\"a\"] is not an integer"));
}

TEST_F(TokenizerFiles, ModelDirectoryWithConfig) {
  Json j = byte_level_json({});
  j["added_tokens"] = Json::array({added_token(256, "<s>"), added_token(257, "</s>")});
  write("tokenizer.json", j.dump());
  write("tokenizer_config.json", Json{{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
                                      {"eos_token", "</s>"},
                                      {"tokenizer_class", "LlamaTokenizerFast"},
                                      {"add_bos_token", true}}
                                     .dump());
  const Tokenizer tok = Tokenizer::load(dir_.string());
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), 257);
  EXPECT_EQ(tok.encode("a", true), (std::vector<int32_t>{256, 'a'}));  // LlamaTokenizerFast's add_bos_token
  EXPECT_EQ(tok.encode("a", false), (std::vector<int32_t>{'a'}));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { tok.chat_template(); }), HasSubstr("no chat template"));

  write("tokenizer_config.json", "{\"bos_token\": 3}");
  EXPECT_THAT(
      testing::thrown_message<ParseError>([&] { Tokenizer::load(dir_.string()); }),
      HasSubstr("tokenizer_config.json: bos_token is not a string or an object with 'content' (it is an integer)"));
  write("tokenizer_config.json", "{\"chat_template\": [");
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { Tokenizer::load(dir_.string()); }),
              HasSubstr("tokenizer_config.json: malformed JSON"));
  write("tokenizer_config.json", "{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": \"<nope>\"}");
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { Tokenizer::load(dir_.string()); }),
              HasSubstr("add_bos_token is on but bos_token is not a token of the vocabulary"));
}

}  // namespace
}  // namespace microllm::testing
