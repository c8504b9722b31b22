// StopStringMatcher: partial matches are held back (never emitted then retracted), matches across any
// split of the text, the earliest of several stop strings wins, UTF-8 characters are never cut.
#include "microllm/generate/stop.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "microllm/core/error.h"
#include "microllm/core/random.h"
#include "test_support.h"

namespace microllm::generate {
namespace {

bool is_whole_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Feeds `pieces`, returning everything emitted (and the pieces emitted, one per push, in `emitted`).
std::string feed(StopStringMatcher& m, const std::vector<std::string>& pieces, std::vector<std::string>* emitted = nullptr) {
  std::string out;
  for (const std::string& p : pieces) {
    const std::string e = m.push(p);
    if (emitted) emitted->push_back(e);
    out += e;
    if (m.stopped()) return out;
  }
  return out + m.flush();
}

// The reference: the text before the earliest occurrence of any stop string.
std::string reference(const std::string& text, const std::vector<std::string>& stops) {
  size_t earliest = std::string::npos;
  for (const std::string& s : stops) earliest = std::min(earliest, text.find(s));
  return earliest == std::string::npos ? text : text.substr(0, earliest);
}

TEST(StopStringMatcher, HoldsBackAPossibleStartUntilDecided) {
  StopStringMatcher m({"</s>"});
  EXPECT_EQ(m.push("Hello <"), "Hello ");
  EXPECT_EQ(m.pending_bytes(), 1u);
  EXPECT_EQ(m.push("/"), "");
  EXPECT_EQ(m.push("x"), "</x");  // decided: not a stop string after all
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push(" and </"), " and ");
  EXPECT_EQ(m.push("s> after"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(*m.matched(), "</s>");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcher, FlushReleasesAnUndecidedTail) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.push("the end ST"), "the end ");
  EXPECT_EQ(m.flush(), "ST");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcher, EarliestOfSeveralWinsAndOverlapsAreHandled) {
  StopStringMatcher m({"world", "lo w"});
  EXPECT_EQ(feed(m, {"hello world"}), "hel");
  EXPECT_EQ(*m.matched(), "lo w");
  StopStringMatcher overlap({"aab"});  // the partial match restarts inside itself
  EXPECT_EQ(feed(overlap, {"a", "a", "a", "b", "c"}), "a");
  EXPECT_TRUE(overlap.stopped());
  StopStringMatcher within({"\n\n"});
  EXPECT_EQ(feed(within, {"one\n", "two\n", "\nthree"}), "one\ntwo");
}

TEST(StopStringMatcher, EverySplitOfRandomTextGivesTheReference) {
  Generator gen(testing::fresh_seed());
  const std::string alphabet = "ab<>/";
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const auto n = static_cast<size_t>(gen.next_uniform() * 40);
    for (size_t i = 0; i < n; ++i) text += alphabet[static_cast<size_t>(gen.next_uniform() * alphabet.size())];
    const std::vector<std::string> stops{"</a>", "bb", "<<a"};
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t len = 1 + static_cast<size_t>(gen.next_uniform() * 4);
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    StopStringMatcher m(stops);
    std::string out = feed(m, pieces);
    EXPECT_EQ(out, reference(text, stops)) << "text: " << text;
    EXPECT_EQ(m.stopped(), out.size() < text.size());
  }
}

TEST(StopStringMatcher, MultiByteUtf8IsNeverCut) {
  const std::string text = "日本語のテキスト, é and 😀 then 本当";
  const std::vector<std::string> stops{"本当", "😀 x"};
  // Byte by byte: every emitted piece is whole UTF-8, the total is the reference.
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  StopStringMatcher m(stops);
  std::vector<std::string> emitted;
  const std::string out = feed(m, bytes, &emitted);
  EXPECT_EQ(out, reference(text, stops));
  EXPECT_EQ(out, "日本語のテキスト, é and 😀 then ");
  for (const std::string& e : emitted) EXPECT_TRUE(is_whole_utf8(e)) << e;
  // No stop strings: the text passes through, characters whole.
  StopStringMatcher none;
  emitted.clear();
  EXPECT_EQ(feed(none, bytes, &emitted), text);
  for (const std::string& e : emitted) EXPECT_TRUE(is_whole_utf8(e)) << e;
  // A stop string that begins with a character the text holds part of.
  StopStringMatcher partial({"日本"});
  EXPECT_EQ(partial.push("x\xE6\x97"), "x");
  EXPECT_EQ(partial.push("\xA5\xE6\x9C"), "");  // 日 and half of 本: could still be the stop string
  EXPECT_EQ(partial.push("\xAC"), "");
  EXPECT_TRUE(partial.stopped());
}

TEST(StopStringMatcher, IncompleteUtf8Suffix) {
  EXPECT_EQ(incomplete_utf8_suffix(""), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xE6"), 1u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xE6\x97"), 2u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xE6\x97\xA5"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_suffix("\x97\xA5"), 0u);  // stray continuation bytes never complete
  EXPECT_EQ(incomplete_utf8_suffix("a\xFF"), 0u);
}

TEST(StopStringMatcher, RejectsEmptyStopStrings) {
  EXPECT_THROW(StopStringMatcher({"ok", ""}), ValueError);
}

}  // namespace
}  // namespace microllm::generate
