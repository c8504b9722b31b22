#include "tokenizer/json_view.h"

#include <fstream>
#include <iterator>
#include <limits>

#include "core/json_text.h"

namespace microllm::tokenizer_detail {

Json parse_json(std::string_view text, const std::string& file) {
  return detail::parse_json(text, "tokenizer", str_cat(file, ": malformed JSON"));
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("tokenizer", str_cat(path, ": cannot open the file"));
  const std::streamoff size = in.tellg();
  if (size < 0) throw IoError("tokenizer", str_cat(path, ": cannot read the file"));
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) throw IoError("tokenizer", str_cat(path, ": read failed"));
  return text;
}

Json read_json_file(const std::string& path) { return parse_json(read_text_file(path), path); }

std::string bare_message(const Error& e) {
  const std::string what = e.what();
  const std::string prefix = "[" + e.where() + "] ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

const char* json_type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    default: return "a binary value";
  }
}

std::string JsonView::child_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : str_cat(path_, ".", key);
}

std::string JsonView::where() const { return path_.empty() ? *file_ : str_cat(*file_, ": ", path_); }

void JsonView::fail(const std::string& problem) const {
  throw ParseError("tokenizer", str_cat(*file_, ": ", path_.empty() ? "the top level" : path_, " ", problem));
}

void JsonView::expect_object() const {
  if (!value_->is_object()) fail(str_cat("is not an object (it is ", json_type_name(*value_), ")"));
}

void JsonView::expect_array() const {
  if (!value_->is_array()) fail(str_cat("is not an array (it is ", json_type_name(*value_), ")"));
}

JsonView JsonView::at(std::string_view key) const {
  expect_object();
  const auto it = value_->find(key);
  const std::string path = child_path(key);
  if (it == value_->end() || it->is_null()) {
    throw ParseError("tokenizer", str_cat(*file_, ": ", path, " is missing"));
  }
  return JsonView(*it, *file_, path);
}

std::optional<JsonView> JsonView::find(std::string_view key) const {
  expect_object();
  const auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) return std::nullopt;
  return JsonView(*it, *file_, child_path(key));
}

JsonView JsonView::element(size_t index) const {
  expect_array();
  return JsonView((*value_)[index], *file_, str_cat(path_, "[", index, "]"));
}

size_t JsonView::size() const {
  if (!value_->is_array() && !value_->is_object()) fail("is not an array or an object");
  return value_->size();
}

const std::string& JsonView::as_string() const {
  if (!value_->is_string()) fail(str_cat("is not a string (it is ", json_type_name(*value_), ")"));
  return value_->get_ref<const std::string&>();
}

bool JsonView::as_bool() const {
  if (!value_->is_boolean()) fail(str_cat("is not a boolean (it is ", json_type_name(*value_), ")"));
  return value_->get<bool>();
}

int64_t JsonView::as_int() const {
  if (value_->is_number_unsigned()) {
    const auto v = value_->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail("is too large");
    return static_cast<int64_t>(v);
  }
  if (!value_->is_number_integer()) fail(str_cat("is not an integer (it is ", json_type_name(*value_), ")"));
  return value_->get<int64_t>();
}

int32_t JsonView::as_id() const {
  const int64_t v = as_int();
  if (v < 0 || v > std::numeric_limits<int32_t>::max()) fail(str_cat("is not a valid token id (", v, ")"));
  return static_cast<int32_t>(v);
}

bool JsonView::bool_or(std::string_view key, bool fallback) const {
  const auto v = find(key);
  return v ? v->as_bool() : fallback;
}

std::optional<std::string> JsonView::optional_string(std::string_view key) const {
  const auto v = find(key);
  if (!v) return std::nullopt;
  return v->as_string();
}

}  // namespace microllm::tokenizer_detail
