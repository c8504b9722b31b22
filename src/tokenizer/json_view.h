// A JSON value together with the file it came from and its path inside it, so that every complaint names
// both: `[tokenizer] /m/tokenizer.json: model.merges[12] is not a string or a pair`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "microllm/core/error.h"

namespace microllm::tokenizer_detail {

using Json = nlohmann::json;

// Parses `text`; a syntax error becomes ParseError naming `file` and the byte offset.
Json parse_json(std::string_view text, const std::string& file);
// Reads and parses a file (IoError when it cannot be read).
Json read_json_file(const std::string& path);
std::string read_text_file(const std::string& path);

// An error's message without its "[where] " prefix, to be wrapped in another context.
std::string bare_message(const Error& e);

// "string", "number", ... for messages.
const char* json_type_name(const Json& j);

class JsonView {
 public:
  JsonView(const Json& value, const std::string& file, std::string path = "")
      : value_(&value), file_(&file), path_(std::move(path)) {}

  const Json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return *file_; }
  bool is_null() const { return value_->is_null(); }
  bool is_string() const { return value_->is_string(); }
  bool is_object() const { return value_->is_object(); }
  bool is_array() const { return value_->is_array(); }

  // A member that must be there (and not null).
  JsonView at(std::string_view key) const;
  // A member that may be absent or null.
  std::optional<JsonView> find(std::string_view key) const;
  JsonView element(size_t index) const;
  size_t size() const;  // of an array or object

  const std::string& as_string() const;
  bool as_bool() const;
  int64_t as_int() const;
  // A token id: an integer in [0, 2^31).
  int32_t as_id() const;
  void expect_object() const;
  void expect_array() const;

  // Optional members with defaults; present but of the wrong type is an error.
  bool bool_or(std::string_view key, bool fallback) const;
  std::optional<std::string> optional_string(std::string_view key) const;

  [[noreturn]] void fail(const std::string& problem) const;
  std::string where() const;  // "<file>: <path>"

 private:
  std::string child_path(std::string_view key) const;
  const Json* value_;
  const std::string* file_;
  std::string path_;
};

}  // namespace microllm::tokenizer_detail
