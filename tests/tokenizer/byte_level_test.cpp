// Byte-level round trips on random UTF-8, the lossy decoding of broken byte sequences, and the streaming
// decoder on characters split across tokens.
#include <gtest/gtest.h>

#include <random>

#include "test_support.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using Ids = std::vector<int32_t>;
using tokenizer_detail::utf8_first_invalid;

std::string random_utf8(std::mt19937_64& rng, size_t chars) {
  // Code points from ASCII, Latin, CJK, emoji and the whole range, surrogates excluded.
  std::string s;
  for (size_t i = 0; i < chars; ++i) {
    char32_t cp = 0;
    switch (rng() % 6) {
      case 0: cp = 0x20 + rng() % 0x5F; break;
      case 1: cp = " \t\n\r"[rng() % 4]; break;
      case 2: cp = 0xA0 + rng() % 0x500; break;
      case 3: cp = 0x4E00 + rng() % 0x5000; break;
      case 4: cp = 0x1F300 + rng() % 0x300; break;
      default:
        do cp = rng() % 0x110000;
        while (cp >= 0xD800 && cp <= 0xDFFF);
    }
    tokenizer_detail::utf8_append(s, cp);
  }
  return s;
}

Tokenizer small_byte_level() {
  const std::string G = byte_char(' ');
  return tokenizer_of(byte_level_json(
      {{"t", "h"}, {"th", "e"}, {G, "the"}, {byte_char(0xC3), byte_char(0xA9)}, {G, "a"}, {"i", "n"}, {G, "in"}}));
}

TEST(ByteLevel, RandomUtf8RoundTrips) {
  const Tokenizer tok = small_byte_level();
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_utf8(rng, rng() % 80);
    const Ids ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), text) << "trial " << trial;
  }
}

TEST(ByteLevel, DecodeReplacesBrokenSequences) {
  const Tokenizer tok = small_byte_level();
  // Byte ids are the byte values: an unfinished 3-byte character, a stray continuation byte, then 'A'.
  EXPECT_EQ(tok.decode(Ids{0xE2, 0x82}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(Ids{0xE2, 0x82, 'A'}),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(tok.decode(Ids{0x80, 'A'}),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(tok.decode(Ids{0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80");
  EXPECT_EQ(tok.decode(Ids{0xED, 0xA0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: 3 replacements
  EXPECT_EQ(tok.decode(Ids{0xC0, 0xAF}), "\xEF\xBF\xBD\xEF\xBF\xBD");                    // overlong
  EXPECT_EQ(tok.decode(Ids{99999, 'A'}), "A") << "unknown ids are skipped";
}

TEST(StreamDecoder, HoldsBackSplitCharacters) {
  const Tokenizer tok = small_byte_level();
  // "é😀x" as single bytes: nothing comes out until a character is whole.
  StreamDecoder s = tok.stream_decoder();
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push('x'), "x");
  EXPECT_EQ(s.finish(), "");
  // A character that never completes comes out as U+FFFD, as soon as it cannot complete or at the end.
  StreamDecoder t = tok.stream_decoder();
  EXPECT_EQ(t.push(0xE2), "");
  EXPECT_EQ(t.push('A'),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(t.push(0xF0), "");
  EXPECT_EQ(t.finish(), "\xEF\xBF\xBD");
}

TEST(StreamDecoder, PiecesAreUtf8AndAddUpToDecode) {
  const Tokenizer tok = small_byte_level();
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 200; ++trial) {
    Ids ids;
    const size_t n = rng() % 40;
    for (size_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>(rng() % 263));  // random bytes and merges
    StreamDecoder s = tok.stream_decoder();
    std::string joined;
    for (const int32_t id : ids) {
      const std::string piece = s.push(id);
      ASSERT_EQ(utf8_first_invalid(piece), piece.size());
      joined += piece;
    }
    joined += s.finish();
    ASSERT_EQ(joined, tok.decode(ids)) << "trial " << trial;
  }
}

TEST(StreamDecoder, SkipsSpecialTokens) {
  Json j = byte_level_json({});
  j["added_tokens"] = Json::array({added_token(256, "<|end|>"), added_token(257, "<mark>", false)});
  const Tokenizer tok = tokenizer_of(j);
  const Ids ids = tok.encode("a<|end|>b<mark>");
  EXPECT_EQ(ids, (Ids{'a', 256, 'b', 257}));
  StreamDecoder s = tok.stream_decoder(true);
  EXPECT_EQ(s.push(ids), "ab<mark>");
  EXPECT_EQ(tok.decode(ids, true), "ab<mark>");
  EXPECT_EQ(tok.decode(ids), "a<|end|>b<mark>");
  EXPECT_TRUE(tok.is_special(256));
  EXPECT_FALSE(tok.is_special(257));
}

TEST(Unicode, Utf8Helpers) {
  using namespace tokenizer_detail;
  EXPECT_EQ(utf8_first_invalid("abc\xC3\xA9"), 5u);
  EXPECT_EQ(utf8_first_invalid("ab\xC3"), 2u);
  EXPECT_EQ(utf8_first_invalid("ab\xED\xA0\x80"), 2u);    // surrogate
  EXPECT_EQ(utf8_first_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_incomplete_tail("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE2"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("ab\xE2"
                                 "A"),
            0u);
  EXPECT_EQ(utf8_incomplete_tail("\x80"), 0u);
  EXPECT_EQ(unicode_normalize("e\xCC\x81", NormalForm::nfc), "\xC3\xA9");
  EXPECT_EQ(unicode_normalize("\xC3\xA9", NormalForm::nfd), "e\xCC\x81");
  EXPECT_EQ(unicode_normalize("\xEF\xAC\x81", NormalForm::nfkc), "fi");
  EXPECT_TRUE(is_rust_whitespace(0x3000));
  EXPECT_TRUE(is_rust_whitespace(0x85));
  EXPECT_FALSE(is_rust_whitespace(0x200B));
  EXPECT_TRUE(is_rust_alphanumeric(0x4E2D));
  EXPECT_TRUE(is_rust_alphanumeric(0x2167));  // Roman numeral eight (Nl)
  EXPECT_FALSE(is_rust_alphanumeric('_'));
  EXPECT_TRUE(is_python_space(0x1C));
  EXPECT_TRUE(is_python_space(0xA0));
  EXPECT_FALSE(is_python_space(0x200B));
}

}  // namespace
}  // namespace microllm::testing
