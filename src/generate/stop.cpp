#include "microllm/generate/stop.h"

#include <algorithm>

#include "microllm/core/error.h"

namespace microllm::generate {

size_t incomplete_utf8_suffix(std::string_view text) {
  // Walk back over at most three continuation bytes to the lead byte of the last character.
  const size_t n = text.size();
  size_t continuation = 0;
  while (continuation < 3 && continuation < n &&
         (static_cast<unsigned char>(text[n - 1 - continuation]) & 0xC0) == 0x80) {
    ++continuation;
  }
  if (continuation == n) return 0;  // only continuation bytes (or empty): nothing to wait for
  const auto lead = static_cast<unsigned char>(text[n - 1 - continuation]);
  size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4;
  else return 0;  // ASCII, or a byte that never starts a character
  return continuation + 1 < length ? continuation + 1 : 0;
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings) : stop_strings_(std::move(stop_strings)) {
  for (const std::string& s : stop_strings_) {
    MICROLLM_CHECK(!s.empty(), ValueError, "stop_strings", "a stop string is empty");
  }
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped()) return {};
  pending_.append(text);
  // A complete stop string: emit up to the earliest occurrence. Nothing emitted before can be part of
  // one (everything that could have been was held back), so searching pending_ alone is enough.
  size_t earliest = std::string::npos;
  for (const std::string& s : stop_strings_) {
    const size_t at = pending_.find(s);
    if (at < earliest) {
      earliest = at;
      matched_ = s;
    }
  }
  if (earliest != std::string::npos) {
    std::string out = pending_.substr(0, earliest);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string, and an unfinished character.
  size_t hold = incomplete_utf8_suffix(pending_);
  for (const std::string& s : stop_strings_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped() ? std::string() : out;
}

}  // namespace microllm::generate
