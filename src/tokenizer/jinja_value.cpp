// Values: Python's truthiness, equality, ordering, str/repr and json.dumps over the template's values.
#include "tokenizer/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "microllm/core/error.h"
#include "tokenizer/unicode.h"

namespace microllm::jinja {

using tokenizer_detail::utf8_next;

Value::Value(Dict dict) : data_(std::make_shared<const Dict>(std::move(dict))) {}

const Dict& Value::as_dict() const {
  if (is_namespace()) return *as_namespace();
  return *std::get<DictPtr>(data_);
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "NoneType";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::dict: return "dict";
    case Value::Kind::namespace_: return "Namespace";
    case Value::Kind::callable: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return false;
    case Value::Kind::boolean: return v.as_bool();
    case Value::Kind::integer: return v.as_int() != 0;
    case Value::Kind::floating: return v.as_double() != 0.0;
    case Value::Kind::string: return !v.as_string().empty();
    case Value::Kind::list: return !v.as_list().empty();
    case Value::Kind::dict: return !v.as_dict().entries.empty();
    case Value::Kind::namespace_:
    case Value::Kind::callable: return true;
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, d, std::chars_format::scientific);
  std::string_view text(buffer, static_cast<size_t>(result.ptr - buffer));  // "-1.2345e+02"
  std::string out;
  if (text.front() == '-') {
    out += '-';
    text.remove_prefix(1);
  }
  const size_t e = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exponent = std::stoi(std::string(text.substr(e + 1)));
  if (exponent >= -4 && exponent < 16) {  // positional, as repr() writes it
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else {
      const size_t integer_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= integer_digits) {
        out += digits + std::string(integer_digits - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, integer_digits) + "." + digits.substr(integer_digits);
      }
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof exponent_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exponent_text;
}

namespace {

constexpr int kMaxNesting = 200;

// Python's str.isprintable() for one code point: not Cc, Cf, Cs, Co, Cn, Zl, Zp, nor Zs other than ' '.
bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = utf8_next(s, i);
    char escaped[16];
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (is_printable(cp)) {
      tokenizer_detail::utf8_append(out, cp);
    } else {
      const unsigned code = static_cast<unsigned>(cp);
      std::snprintf(escaped, sizeof escaped, code < 0x100 ? "\\x%02x" : code < 0x10000 ? "\\u%04x" : "\\U%08x", code);
      out += escaped;
    }
  }
  return out + quote;
}

std::string repr_in(const Value& v);

std::string list_repr(const List& list, bool tuple) {
  std::string out = tuple ? "(" : "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + repr_in(list[i]);
  if (tuple && list.size() == 1) out += ",";
  return out + (tuple ? ")" : "]");
}

std::string dict_repr(const Dict& dict) {
  std::string out = "{";
  for (size_t i = 0; i < dict.entries.size(); ++i) {
    out += (i ? ", " : "") + string_repr(dict.entries[i].first) + ": " + repr_in(dict.entries[i].second);
  }
  return out + "}";
}

// repr of an element inside a container: Undefined shows as its class name there. Nesting is bounded: a
// namespace can hold itself (`set ns.me = ns`).
std::string repr_in(const Value& v) {
  thread_local int depth = 0;
  if (depth > kMaxNesting) fail_unsupported("a value nested deeper than 200 levels");
  ++depth;
  struct Leave {
    ~Leave() { --depth; }
  } leave;
  return v.is_undefined() ? "Undefined" : repr(v);
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.as_bool() ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.as_int());
    case Value::Kind::floating: return python_float_repr(v.as_double());
    case Value::Kind::string: return string_repr(v.as_string());
    case Value::Kind::list: return list_repr(v.as_list(), v.is_tuple());
    case Value::Kind::dict: return dict_repr(v.as_dict());
    case Value::Kind::namespace_: return "<Namespace " + dict_repr(v.as_dict()) + ">";
    case Value::Kind::callable: return "<function " + v.as_function().name + ">";
  }
  return "";
}

std::string to_str(const Value& v) { return v.is_string() ? v.as_string() : repr(v); }

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.as_string() == b.as_string();
    case Value::Kind::list: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::dict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x.entries) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::namespace_: return a.as_namespace() == b.as_namespace();
    case Value::Kind::callable: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined()) fail("'" + (a.is_undefined() ? a : b).undefined_hint() + "'");
  fail("'" + std::string(op) + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) +
       "'");
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonDumpOptions& options,
                const std::pair<std::string, std::string>& separators, int depth) {
  if (depth > kMaxNesting) fail_unsupported("a value nested deeper than 200 levels");
  const auto newline = [&](int level) {
    if (!options.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *options.indent;
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : python_float_repr(d);
      return;
    }
    case Value::Kind::string: json_string(out, v.as_string()); return;
    case Value::Kind::list: {
      const List& list = v.as_list();
      if (list.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < list.size(); ++i) {
        if (i) out += separators.first;
        newline(depth + 1);
        json_value(out, list[i], options, separators, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.as_dict().entries) entries.push_back(&entry);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* x, auto* y) { return x->first < y->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += separators.first;
        newline(depth + 1);
        json_string(out, entries[i]->first);
        out += separators.second;
        json_value(out, entries[i]->second, options, separators, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: fail("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) fail_unsupported("an integer above 2^63 - 1 in the JSON input");
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      list.reserve(j.size());
      for (const auto& element : j) list.push_back(from_json(element));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (auto it = j.begin(); it != j.end(); ++it) dict.entries.emplace_back(it.key(), from_json(it.value()));
      return Value(std::move(dict));
    }
    default: fail_unsupported("binary JSON data");
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  const std::pair<std::string, std::string> separators =
      options.separators ? *options.separators : std::pair<std::string, std::string>{options.indent ? "," : ", ", ": "};
  std::string out;
  json_value(out, v, options, separators, 0);
  return out;
}

Value value_from_json_text(std::string_view json_text, const std::string& what) {
  // ordered_json: object keys keep their order, as Python's json.loads keeps them.
  const nlohmann::ordered_json parsed = [&] {
    try {
      return nlohmann::ordered_json::parse(json_text.begin(), json_text.end());
    } catch (const nlohmann::json::exception& e) {
      throw ParseError("chat_template", str_cat(what, " is not valid JSON: ", e.what()));
    }
  }();
  try {
    return from_json(parsed);
  } catch (const TemplateError& e) {
    throw NotSupportedError("chat_template", str_cat(what, ": ", e.what(), " is not supported"));
  }
}

}  // namespace microllm::jinja
