// Stop strings for streamed text: generation ends when the decoded text contains one of them, the stop
// string itself is not emitted, and text that may be the beginning of a stop string is held back until
// it is decided (text is never emitted and then retracted). Works on bytes, so a stop string may be
// split across any number of tokens; an incomplete UTF-8 character at the end is held back too, so each
// emitted piece is whole UTF-8 when the input is.
//
//   StopStringMatcher stop({"</answer>", "\n\n"});
//   for (...) { std::cout << stop.push(decoder.push(token)); if (stop.stopped()) break; }
//   if (!stop.stopped()) std::cout << stop.flush();
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace microllm::generate {

class StopStringMatcher {
 public:
  // Empty stop strings are a ValueError. No stop strings: text passes through (whole UTF-8 only).
  explicit StopStringMatcher(std::vector<std::string> stop_strings = {});

  // Appends newly decoded text; returns what can be emitted now. When a stop string completes, returns
  // the text up to its first occurrence (the earliest among all stop strings) and stopped() turns true;
  // later pushes return "".
  std::string push(std::string_view text);
  // The end of the stream: returns the held-back text (nothing more can complete a stop string).
  std::string flush();

  bool stopped() const { return matched_.has_value(); }
  // The stop string that ended the text.
  const std::optional<std::string>& matched() const { return matched_; }
  // Bytes held back, waiting to be decided.
  size_t pending_bytes() const { return pending_.size(); }
  const std::vector<std::string>& stop_strings() const { return stop_strings_; }

 private:
  std::vector<std::string> stop_strings_;
  std::string pending_;
  std::optional<std::string> matched_;
};

// The length of an incomplete UTF-8 character at the end of `text` (0 when it ends on a character
// boundary or with bytes that can never become valid UTF-8).
size_t incomplete_utf8_suffix(std::string_view text);

}  // namespace microllm::generate
