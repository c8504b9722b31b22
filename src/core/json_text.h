// Parsing JSON text for the library's readers (internal header, header-only: nlohmann-json is a private
// dependency of each layer that reads JSON, so core itself does not link it). The JSON library fails in two
// ways, a parse_error for bad syntax and an out_of_range for a number past a double's range ("1e309"); a
// reader that catches only the first lets the second out as the library's own exception, which a server turns
// into a 500. Every reader parses through here instead and gets one ParseError for both.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "microllm/core/error.h"

namespace microllm::detail {

// Parses `text`; any failure throws ParseError(where, "<problem> at byte N: <detail>"), the byte offset for a
// syntax error only, the library's "[json.exception...] " prefix dropped from the detail.
inline nlohmann::json parse_json(std::string_view text, const std::string& where, const std::string& problem) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    std::string detail = e.what();
    if (detail.rfind("[json.exception", 0) == 0 && detail.find("] ") != std::string::npos) {
      detail = detail.substr(detail.find("] ") + 2);
    }
    const auto* syntax = dynamic_cast<const nlohmann::json::parse_error*>(&e);
    throw ParseError(where, syntax != nullptr ? str_cat(problem, " at byte ", syntax->byte, ": ", detail)
                                              : str_cat(problem, ": ", detail));
  }
}

}  // namespace microllm::detail
