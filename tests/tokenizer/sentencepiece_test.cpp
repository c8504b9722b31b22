// The components of SentencePiece-lineage tokenizer.json files on a small vocabulary, with results worked
// out by hand from Hugging Face tokenizers' code: Metaspace (prepend_scheme, split), the Llama 2 layout
// (Prepend/Replace normalizers, byte fallback), the ByteFallback, Fuse, Strip, Replace and Metaspace
// decoders whole and streamed, and what is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/decoder.h"
#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

const std::string kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's word marker
constexpr int32_t kUnk = 0, kBos = 1, kMark = 259, kA = 260, kB = 261, kMarkA = 262, kAMark = 263;
constexpr int32_t byte_id(int b) { return 3 + b; }

// <unk> <s> </s>, the 256 byte tokens, then ▁ a b ▁a a▁ ab; byte fallback on, <unk> for the rest.
Json sentencepiece_json(const std::vector<std::string>& merges = {}) {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = byte_id(b);
  }
  vocab[kMeta] = kMark;
  vocab["a"] = kA;
  vocab["b"] = kB;
  vocab[kMeta + "a"] = kMarkA;
  vocab["a" + kMeta] = kAMark;
  vocab["ab"] = 264;
  Json model = {{"type", "BPE"},        {"vocab", vocab},   {"merges", merges},
                {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true}};
  return {{"model", model}, {"added_tokens", Json::array({added_token(0, "<unk>"), added_token(1, "<s>")})}};
}

Json metaspace(const std::string& scheme, bool split) {
  return {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", split}};
}
Json replace(const Json& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", pattern}, {"content", content}};
}
Json strip(const std::string& content, int start, int stop) {
  return {{"type", "Strip"}, {"content", content}, {"start", start}, {"stop", stop}};
}
Json sequence(const Json& decoders) { return {{"type", "Sequence"}, {"decoders", decoders}}; }
Json simple(const std::string& type) { return {{"type", type}}; }

// The pieces a StreamDecoder gives for `ids`, finish() last.
std::vector<std::string> stream_pieces(const Tokenizer& tok, const Ids& ids) {
  StreamDecoder stream = tok.stream_decoder();
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(stream.push(id));
  pieces.push_back(stream.finish());
  return pieces;
}
using Pieces = std::vector<std::string>;

const std::string kFffd = "\xEF\xBF\xBD";

TEST(SentencePiece, Llama2Layout) {
  // Llama 2 / Mistral v0.1 / TinyLlama: "▁" prepended and spaces replaced by the normalizer, no
  // pre-tokenizer, and the decoder Replace, ByteFallback, Fuse, Strip(one leading space).
  Json j = sentencepiece_json();
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", Json::array({{{"type", "Prepend"}, {"prepend", kMeta}}, replace({{"String", " "}}, kMeta)})}};
  j["decoder"] = sequence(
      Json::array({replace({{"String", kMeta}}, " "), simple("ByteFallback"), simple("Fuse"), strip(" ", 1, 0)}));
  const Tokenizer tok = tokenizer_of(j);
  EXPECT_EQ(tok.encode("a b"), (Ids{kMark, kA, kMark, kB}));
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{kMark, byte_id(0xC3), byte_id(0xA9)}));  // é through its bytes
  EXPECT_EQ(tok.encode("<s>a"), (Ids{kBos, kMark, kA}));  // the normalizer runs on each piece after <s>
  EXPECT_EQ(tok.decode(Ids{kMark, kA, kMark, kB}), "a b");
  EXPECT_EQ(tok.decode(Ids{kMark, kMark, kA}), " a");  // only one leading space is stripped
  EXPECT_EQ(tok.decode(Ids{kBos, kMark, kA}), "<s> a");
  EXPECT_EQ(tok.decode(Ids{kBos, kMark, kA}, true), "a");
  EXPECT_EQ(tok.decode(Ids{byte_id(0xC3), kA}), kFffd + "a");
  // The first "▁" is stripped at once; a byte run waits for the token that ends it.
  EXPECT_EQ(stream_pieces(tok, Ids{kMark, kA, byte_id(0xE6), byte_id(0x97), byte_id(0xA5), kMark}),
            (Pieces{"", "a", "", "", "", "\xE6\x97\xA5 ", ""}));
  EXPECT_EQ(stream_pieces(tok, Ids{kMark, byte_id(0xE6), byte_id(0x97)}), (Pieces{"", "", "", kFffd + kFffd}));
}

TEST(SentencePiece, MetaspacePrependScheme) {
  Json j = sentencepiece_json();
  j["pre_tokenizer"] = metaspace("always", false);
  EXPECT_EQ(tokenizer_of(j).encode("a b"), (Ids{kMark, kA, kMark, kB}));
  EXPECT_EQ(tokenizer_of(j).encode("<s>a"), (Ids{kBos, kMark, kA}));
  EXPECT_EQ(tokenizer_of(j).encode(kMeta + "a"), (Ids{kMark, kA})) << "no second marker";
  j["pre_tokenizer"] = metaspace("first", false);
  EXPECT_EQ(tokenizer_of(j).encode("a"), (Ids{kMark, kA}));
  EXPECT_EQ(tokenizer_of(j).encode("<s>a"), (Ids{kBos, kA})) << "the piece after <s> does not start the text";
  EXPECT_EQ(tokenizer_of(j).encode("a<s>a"), (Ids{kMark, kA, kBos, kA}));
  EXPECT_EQ(tokenizer_of(j).encode(" a"), (Ids{kMark, kA})) << "the space is the marker";
  j["pre_tokenizer"] = metaspace("never", true);
  EXPECT_EQ(tokenizer_of(j).encode("a b"), (Ids{kA, kMark, kB}));
  // Inside a Sequence, after a Split that removes the start, the first word no longer starts the text.
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({{{"type", "WhitespaceSplit"}}, metaspace("first", true)})}};
  EXPECT_EQ(tokenizer_of(j).encode("a b"), (Ids{kMark, kA, kB}));
  EXPECT_EQ(tokenizer_of(j).encode(" a b"), (Ids{kA, kB}));
}

TEST(SentencePiece, MetaspaceSplit) {
  // With the merge "a ▁", one unsplit word "▁a▁b" merges across the marker; split words cannot.
  Json j = sentencepiece_json({"a " + kMeta});
  j["pre_tokenizer"] = metaspace("always", false);
  EXPECT_EQ(tokenizer_of(j).encode("a b"), (Ids{kMark, kAMark, kB}));
  j["pre_tokenizer"] = metaspace("always", true);
  EXPECT_EQ(tokenizer_of(j).encode("a b"), (Ids{kMark, kA, kMark, kB}));
  EXPECT_EQ(tokenizer_of(j).encode("a  b"), (Ids{kMark, kA, kMark, kMark, kB}));
}

TEST(SentencePiece, ByteFallbackAndUnknown) {
  Json j = sentencepiece_json();
  EXPECT_EQ(tokenizer_of(j).encode("a\xC3\xA9"), (Ids{kA, byte_id(0xC3), byte_id(0xA9)}));
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(tokenizer_of(j).encode("a\xC3\xA9\xC3\xA9"), (Ids{kA, kUnk})) << "fuse_unk: one <unk> for the run";
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(tokenizer_of(j).encode("\xC3\xA9\xC3\xA9"), (Ids{kUnk, kUnk}));
}

TEST(SentencePiece, MetaspaceDecoder) {
  Json j = sentencepiece_json();
  j["decoder"] = metaspace("first", true);
  const Tokenizer first = tokenizer_of(j);
  EXPECT_EQ(first.decode(Ids{kMarkA, kMarkA}), "a a");
  EXPECT_EQ(first.decode(Ids{kMark, kMark, kA}), " a");
  EXPECT_EQ(first.decode(Ids{kAMark, kA}), "aa") << "every marker of the first token goes";
  EXPECT_EQ(first.decode(Ids{kBos, kMarkA}, true), "a") << "the first token after skipping";
  EXPECT_EQ(first.decode(Ids{kBos, kMarkA}), "<s> a");
  j["decoder"] = metaspace("never", true);
  EXPECT_EQ(tokenizer_of(j).decode(Ids{kMark, kMark, kA}), "  a");
}

TEST(SentencePiece, ByteFallbackDecoder) {
  Json j = sentencepiece_json();
  j["decoder"] = simple("ByteFallback");
  const Tokenizer tok = tokenizer_of(j);
  EXPECT_EQ(tok.decode(Ids{byte_id(0xC3), byte_id(0xA9)}), "\xC3\xA9");
  EXPECT_EQ(tok.decode(Ids{byte_id(0xE6), byte_id(0x97), kA}), kFffd + kFffd + "a") << "one U+FFFD per byte";
  EXPECT_EQ(tok.decode(Ids{byte_id(0xE6), byte_id(0x97), byte_id(0xA5), byte_id(0xFF)}), kFffd + kFffd + kFffd + kFffd)
      << "a run is text only if all of it is UTF-8";
  EXPECT_EQ(stream_pieces(tok, Ids{byte_id(0xE6), byte_id(0x97), byte_id(0xA5), byte_id(0xFF), kA}),
            (Pieces{"", "", "", "", kFffd + kFffd + kFffd + kFffd + "a", ""}));
}

TEST(SentencePiece, StripDecoder) {
  Json j = sentencepiece_json();
  // After Fuse, Strip acts on the whole text: trailing markers wait until something else follows.
  j["decoder"] = sequence(Json::array({simple("Fuse"), strip(kMeta, 1, 2)}));
  const Tokenizer joined = tokenizer_of(j);
  EXPECT_EQ(joined.decode(Ids{kMark, kMark, kA, kMark, kMark, kMark}), kMeta + "a" + kMeta);
  EXPECT_EQ(stream_pieces(joined, Ids{kMark, kMark, kA, kMark, kMark, kMark}),
            (Pieces{"", "", kMeta + "a", "", "", "", kMeta}));
  EXPECT_EQ(stream_pieces(joined, Ids{kA, kMark, kB}), (Pieces{"a", "", kMeta + "b", ""}));
  // Without Fuse, each token is stripped.
  j["decoder"] = strip(kMeta, 1, 1);
  EXPECT_EQ(tokenizer_of(j).decode(Ids{kAMark, kMarkA, kA}), "aaa");
  // After Fuse, a one-character Replace goes piece by piece.
  j["decoder"] = sequence(Json::array({simple("Fuse"), replace({{"String", kMeta}}, " ")}));
  EXPECT_EQ(tokenizer_of(j).decode(Ids{kMarkA, kMarkA}), " a a");
  // An empty Sequence inside another passes the tokens on to the stages after it.
  j["decoder"] = sequence(Json::array({sequence(Json::array()), simple("Fuse"), strip(kMeta, 1, 1)}));
  EXPECT_EQ(tokenizer_of(j).decode(Ids{kMarkA, kMark}), "a");
}

// Unigram: the segmentation with the highest total score; a character with no piece of its own is <unk>
// scored (lowest score - 10), and runs of them are one <unk>, or their bytes with byte_fallback.
TEST(SentencePiece, UnigramViterbi) {
  Json pieces = Json::array({Json::array({"<unk>", 0.0}), Json::array({"a", -1.0}), Json::array({"b", -1.0}),
                             Json::array({"ab", -1.5}), Json::array({"abc", -30.0}), Json::array({"bc", -2.5}),
                             Json::array({"<0x63>", -5.0})});
  Json j = {{"model", {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", pieces}}}};
  const Tokenizer tok = tokenizer_of(j);
  EXPECT_EQ(tok.encode("ab"), (Ids{3}));  // -1.5 beats a + b (-2)
  EXPECT_EQ(tok.encode("abab"), (Ids{3, 3}));
  EXPECT_EQ(tok.encode("abc"), (Ids{1, 5}));  // a + bc (-3.5) beats abc (-30) and ab + <unk> (-1.5 - 40)
  EXPECT_EQ(tok.encode("xy"), (Ids{0})) << "two unknown characters, one <unk>";
  EXPECT_EQ(tok.encode("axyb"), (Ids{1, 0, 2}));
  EXPECT_EQ(tok.encode("c"), (Ids{0})) << "<0x63> is a piece, but not the character c";
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(tokenizer_of(j).encode("ac"), (Ids{1, 6})) << "byte fallback for the unknown c";
  EXPECT_EQ(tokenizer_of(j).encode("x"), (Ids{0})) << "no <0x78>: <unk>";
  EXPECT_EQ(tok.decode(Ids{3, 1, 0}), "ab a <unk>") << "no decoder: joined by spaces";
  EXPECT_EQ(tok.vocab_size(), 7u);
  EXPECT_EQ(tok.id_to_token(5), "bc");

  j["model"].erase("unk_id");
  EXPECT_THAT(testing::thrown_message<ValueError>([&] { tokenizer_of(j).encode("x"); }),
              HasSubstr("the Unigram model has no piece for 'x' and no unk_id"));
  j["model"]["unk_id"] = 7;
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { tokenizer_of(j); }),
              HasSubstr("model.unk_id is not an index into model.vocab (7; it has 7 pieces)"));
  j["model"]["unk_id"] = 0;
  j["model"]["vocab"][2] = Json::array({"b"});
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { tokenizer_of(j); }),
              HasSubstr("model.vocab[2] is not a [piece, score] pair"));
}

TEST(SentencePiece, ByteTokenNames) {
  unsigned char byte = 0;
  EXPECT_TRUE(tokenizer_detail::parse_byte_token("<0x0A>", byte));
  EXPECT_EQ(byte, 0x0A);
  EXPECT_TRUE(tokenizer_detail::parse_byte_token("<0xfe>", byte));
  EXPECT_EQ(byte, 0xFE);
  EXPECT_TRUE(tokenizer_detail::parse_byte_token("<0x+A>", byte)) << "Rust's from_str_radix takes a '+'";
  EXPECT_EQ(byte, 0x0A);
  for (const char* not_byte : {"<0xG0>", "<0x0A", "<0x00A>", "<0X0A>", "0x0A>", "<0x-1>", "<0x>"})
    EXPECT_FALSE(tokenizer_detail::parse_byte_token(not_byte, byte)) << not_byte;
}

TEST(SentencePiece, RefusedDecodersSayWhich) {
  Json j = sentencepiece_json();
  auto refusal = [&](const Json& decoder) {
    j["decoder"] = decoder;
    return testing::thrown_message<NotSupportedError>([&] { tokenizer_of(j); });
  };
  EXPECT_THAT(refusal(sequence(Json::array({simple("Fuse"), simple("ByteFallback")}))),
              HasSubstr("tokenizer.json: decoder.decoders[1].type: the decoder 'ByteFallback' after Fuse is not "
                        "supported (it needs whole tokens)"));
  EXPECT_THAT(refusal(sequence(Json::array({simple("ByteLevel"), strip(" ", 1, 0)}))),
              HasSubstr("decoder.decoders[1].type: the decoder 'Strip' after ByteLevel is not supported"));
  EXPECT_THAT(refusal(sequence(Json::array({simple("Fuse"), replace({{"String", "ab"}}, "x")}))),
              HasSubstr("the decoder 'Replace' after Fuse is not supported (only a one-character String pattern"));
  EXPECT_THAT(refusal(sequence(Json::array({simple("Fuse"), replace({{"Regex", "a"}}, "x")}))),
              HasSubstr("the decoder 'Replace' after Fuse"));
  EXPECT_THAT(refusal(simple("CTC")), HasSubstr("decoder.type: the decoder 'CTC' is not supported"));
  j["model"]["type"] = "WordLevel";
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { tokenizer_of(j); }),
              HasSubstr("model.type: the model 'WordLevel' is not supported (only BPE and Unigram)"));
}

TEST(SentencePiece, MalformedSettings) {
  Json j = sentencepiece_json();
  auto parse_error = [&](const Json& pre_tokenizer) {
    j["pre_tokenizer"] = pre_tokenizer;
    return testing::thrown_message<ParseError>([&] { tokenizer_of(j); });
  };
  Json m = metaspace("first", true);
  m["replacement"] = "ab";
  EXPECT_THAT(parse_error(m), HasSubstr("pre_tokenizer.replacement is not one character ('ab')"));
  m = metaspace("sometimes", true);
  EXPECT_THAT(parse_error(m), HasSubstr("pre_tokenizer.prepend_scheme is not a prepend scheme ('sometimes'"));
  m = {{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", false}};
  EXPECT_THAT(parse_error(m), HasSubstr("pre_tokenizer has add_prefix_space false but a prepend_scheme other"));
  m["prepend_scheme"] = "never";
  j["pre_tokenizer"] = m;
  EXPECT_EQ(tokenizer_of(j).encode("a"), (Ids{kA}));
  j.erase("pre_tokenizer");
  j["decoder"] = strip("", 1, 0);
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { tokenizer_of(j); }),
              HasSubstr("decoder.content is not one character"));
  j["decoder"] = strip(" ", -1, 0);
  EXPECT_THAT(testing::thrown_message<ParseError>([&] { tokenizer_of(j); }), HasSubstr("decoder.start is negative"));
}

TEST(SentencePiece, TokenizerModelOnlyFolderSaysHowToConvert) {
  const auto dir = std::filesystem::temp_directory_path() / ("microllm_spm_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "not read";
  std::ofstream(dir / "tokenizer_config.json") << "{}";
  const std::string message = testing::thrown_message<NotSupportedError>([&] { Tokenizer::load(dir.string()); });
  EXPECT_THAT(message, HasSubstr(dir.string() + " has only tokenizer.model"));
  EXPECT_THAT(message, HasSubstr("AutoTokenizer.from_pretrained('" + dir.string() + "').save_pretrained('"));
  // A model folder with only tokenizer.model is not taken for a model that works on bytes.
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { (void)Tokenizer::load_if_present(dir.string()); }),
              HasSubstr("has only tokenizer.model"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([&] { Tokenizer::load((dir / "tokenizer.model").string()); }),
              HasSubstr("tokenizer.model: SentencePiece's tokenizer.model is not read here"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace microllm::testing
