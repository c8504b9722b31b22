// Jinja's builtin filters and tests, as jinja2 3.1 defines them, with tojson as transformers overrides it
// (json.dumps with ensure_ascii=False, indent, separators and sort_keys). The parser refuses a filter or
// test that is not here, naming it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>
#include <utility>

#include "microllm/core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"

namespace microllm::jinja {

namespace {

// environment.getitem over a dotted path ("function.name", "0"), as jinja2's make_attrgetter does.
Value attribute_path(const Value& object, const std::string& path) {
  Value v = object;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    v = get_item(v, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::string string_of(const Value& v, std::string_view what) {
  if (!v.is_string()) fail(str_cat("TypeError: ", what, " must be a string, not ", type_name(v)));
  return v.as_string();
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Jinja's title filter: words start after runs of whitespace, '-', '(', '{', '[' or '<'.
std::string jinja_title(const std::string& s) {
  const std::u32string cps = to_code_points(s);
  std::string out;
  size_t i = 0;
  auto is_separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' || (c >= '\t' && c <= '\r') ||
           c == 0x1c || c == 0x1d || c == 0x1e || c == 0x1f || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
  };
  while (i < cps.size()) {
    const size_t start = i;
    const bool separator = is_separator(cps[i]);
    while (i < cps.size() && is_separator(cps[i]) == separator) ++i;
    const std::string part = from_code_points(std::u32string_view(cps).substr(start, i - start));
    if (separator) {
      out += part;
    } else {
      out += python_upper(from_code_points(std::u32string(1, cps[start])));
      out += python_lower(from_code_points(std::u32string_view(cps).substr(start + 1, i - start - 1)));
    }
  }
  return out;
}

std::string indent(const std::string& s, const Value& width, bool first, bool blank) {
  const std::string indention =
      width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
  // Python's str.splitlines() on s + "\n", as jinja2 does.
  std::vector<std::string> lines;
  size_t start = 0;
  const std::string text = s + "\n";
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(text.substr(start, i - start));
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !lines[i].empty())) out += indention;
    out += lines[i];
  }
  return first ? indention + out : out;
}

Value python_round(const Value& v, int64_t precision, const std::string& method) {
  if (!v.is_number()) fail(str_cat("TypeError: type ", type_name(v), " doesn't define __round__ method"));
  const double x = v.as_double();
  if (method == "ceil" || method == "floor") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return Value((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
  }
  if (method != "common") fail("FilterArgumentError: method must be common, ceil or floor");
  if (!v.is_float()) return Value(v.as_int());          // Python's round() keeps an int an int
  if (precision == 0) return Value(std::nearbyint(x));  // round half to even, as Python's round()
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), x);
  return Value(std::strtod(buffer, nullptr));
}

// Sort keys: strings compare case-insensitively unless case_sensitive, as jinja2's ignore_case.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(python_lower(v.as_string())) : v;
}

List sorted(List items, bool reverse, bool case_sensitive, const Value& attribute) {
  auto key = [&](const Value& v) {
    return sort_key(attribute.is_string() ? attribute_path(v, attribute.as_string()) : v, case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? compare(key(b), key(a), "<") < 0 : compare(key(a), key(b), "<") < 0;
  });
  return items;
}

CallArguments rest_of(const CallArguments& args, size_t from) {
  CallArguments rest;
  for (size_t i = from; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

// select / reject / selectattr / rejectattr: keep the items whose test (by name, else truthiness) passes.
List select(const Value& subject, CallArguments& args, bool by_attribute, bool keep) {
  const List items = iterate(subject);
  std::string attribute;
  size_t next = 0;
  if (by_attribute) attribute = string_of(argument(args, next++, ""), "the attribute");
  const Value test = argument(args, next, "");
  CallArguments test_args = rest_of(args, next + 1);
  List out;
  for (const Value& item : items) {
    const Value v = by_attribute ? attribute_path(item, attribute) : item;
    const bool passed = test.is_undefined() ? truthy(v) : apply_test(string_of(test, "the test name"), v, test_args);
    if (passed == keep) out.push_back(item);
  }
  return out;
}

Value map_filter(const Value& subject, CallArguments& args) {
  List out;
  const Value attribute = argument(args, 99, "attribute");
  if (attribute.is_string()) {
    const Value fallback = argument(args, 99, "default");
    for (const Value& item : iterate(subject)) {
      Value v = attribute_path(item, attribute.as_string());
      out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
    return Value(std::move(out));
  }
  const std::string filter = string_of(argument(args, 0, ""), "the filter name");
  if (!is_known_filter(filter)) fail_unsupported(str_cat("the filter '", filter, "' (in map)"));
  CallArguments filter_args = rest_of(args, 1);
  for (const Value& item : iterate(subject)) out.push_back(apply_filter(filter, item, filter_args));
  return Value(std::move(out));
}

// Text Python's int() (digits) or float() (digits, '.', exponent, inf, nan) would read, with '_' removed;
// strtod alone would also take hexadecimal.
bool python_number_text(const std::string& s, bool integer) {
  if (s.empty()) return false;
  const std::string lower = python_lower(s);
  const size_t sign = (lower[0] == '+' || lower[0] == '-') ? 1 : 0;
  const std::string word = lower.substr(sign);
  if (!integer && (word == "inf" || word == "infinity" || word == "nan")) return true;
  return !word.empty() && word.find_first_not_of(integer ? "0123456789" : "0123456789.e+-") == std::string::npos;
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_bool() || v.is_int()) return Value(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_double()) ? Value(static_cast<int64_t>(v.as_double())) : fallback;
  if (v.is_string()) {
    std::string s = python_strip(v.as_string(), Value::none(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (python_number_text(s, true) && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(i));
    const double d = std::strtod(s.c_str(), &end);
    if (python_number_text(s, false) && *end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(d));
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    std::string s = python_strip(v.as_string(), Value::none(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (python_number_text(s, false) && *end == '\0') return Value(d);
  }
  return fallback;
}

Value tojson(const Value& subject, CallArguments& args) {
  check_arguments(args, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (truthy(argument(args, 0, "ensure_ascii", Value(false)))) fail_unsupported("tojson(ensure_ascii=True)");
  JsonDumpOptions options;
  const Value indent_value = argument(args, 1, "indent", Value::none());
  if (indent_value.is_string())
    options.indent = indent_value.as_string();
  else if (indent_value.is_int())
    options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent_value.as_int())), ' ');
  else if (!indent_value.is_none())
    fail("TypeError: tojson's indent must be an integer or a string");
  const Value separators = argument(args, 2, "separators", Value::none());
  if (separators.is_list() && separators.as_list().size() == 2 && separators.as_list()[0].is_string() &&
      separators.as_list()[1].is_string()) {
    options.separators = {separators.as_list()[0].as_string(), separators.as_list()[1].as_string()};
  } else if (!separators.is_none()) {
    fail("TypeError: tojson's separators must be a pair of strings");
  }
  options.sort_keys = truthy(argument(args, 3, "sort_keys", Value(false)));
  return Value(json_dumps(subject, options));
}

using FilterFunction = Value (*)(const Value&, CallArguments&);

const std::unordered_map<std::string_view, FilterFunction>& filters() {
  static const std::unordered_map<std::string_view, FilterFunction> table = {
      {"abs",
       [](const Value& v, CallArguments&) {
         return v.is_float() ? Value(std::fabs(v.as_double())) : v.as_int() < 0 ? negate(v) : Value(v.as_int());
       }},
      {"attr", [](const Value& v,
                  CallArguments& a) { return get_attribute(v, string_of(argument(a, 0, "name"), "attr's name")); }},
      {"batch",
       [](const Value& v, CallArguments& a) {
         const Value size = argument(a, 0, "linecount");
         if (!size.is_int() || size.as_int() < 1) fail("TypeError: batch needs a positive integer line count");
         const Value fill = argument(a, 1, "fill_with", Value::none());
         List batches, current;
         for (const Value& item : iterate(v)) {
           current.push_back(item);
           if (static_cast<int64_t>(current.size()) == size.as_int()) batches.emplace_back(std::exchange(current, {}));
         }
         if (!current.empty()) {
           while (!fill.is_none() && static_cast<int64_t>(current.size()) < size.as_int()) current.push_back(fill);
           batches.emplace_back(std::move(current));
         }
         return Value(std::move(batches));
       }},
      {"capitalize",
       [](const Value& v, CallArguments&) {
         CallArguments no_arguments;
         return get_attribute(Value(to_str(v)), "capitalize").as_function().call(no_arguments);
       }},
      {"count", [](const Value& v, CallArguments&) { return Value(length(v)); }},
      {"default",
       [](const Value& v, CallArguments& a) {
         const bool boolean = truthy(argument(a, 1, "boolean", Value(false)));
         return (v.is_undefined() || (boolean && !truthy(v))) ? argument(a, 0, "default_value", Value("")) : v;
       }},
      {"dictsort",
       [](const Value& v, CallArguments& a) {
         if (!v.is_dict()) fail("TypeError: dictsort needs a mapping");
         const std::string by = to_str(argument(a, 1, "by", Value("key")));
         if (by != "key" && by != "value")
           fail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
         List pairs;
         for (const auto& [key, value] : v.as_dict().entries) pairs.push_back(Value::tuple({Value(key), value}));
         return Value(sorted(std::move(pairs), truthy(argument(a, 2, "reverse", Value(false))),
                             truthy(argument(a, 0, "case_sensitive", Value(false))), Value(by == "key" ? "0" : "1")));
       }},
      {"escape", [](const Value& v, CallArguments&) { return Value(html_escape(to_str(v))); }},
      {"first",
       [](const Value& v, CallArguments&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
       }},
      {"float", [](const Value& v, CallArguments& a) { return to_float(v, argument(a, 0, "default", Value(0.0))); }},
      {"format",
       [](const Value& v, CallArguments& a) {
         if (!a.keyword.empty()) fail_unsupported("the format filter with keyword arguments");
         return binary_operation("%", Value(to_str(v)), Value(List(a.positional)));
       }},
      {"indent",
       [](const Value& v, CallArguments& a) {
         return Value(indent(to_str(v), argument(a, 0, "width", Value(4)),
                             truthy(argument(a, 1, "first", Value(false))),
                             truthy(argument(a, 2, "blank", Value(false)))));
       }},
      {"int",
       [](const Value& v, CallArguments& a) {
         if (!argument(a, 1, "base").is_undefined()) fail_unsupported("the int filter's base argument");
         return to_int(v, argument(a, 0, "default", Value(0)));
       }},
      {"items",
       [](const Value& v, CallArguments&) {
         if (v.is_undefined()) return Value(List{});
         if (!v.is_dict()) fail("TypeError: Can only get item pairs from a mapping.");
         List pairs;
         for (const auto& [key, value] : v.as_dict().entries) pairs.push_back(Value::tuple({Value(key), value}));
         return Value(std::move(pairs));
       }},
      {"join",
       [](const Value& v, CallArguments& a) {
         const Value attribute = argument(a, 1, "attribute");
         const std::string separator = to_str(argument(a, 0, "d", Value("")));
         std::string out;
         bool first = true;
         for (const Value& item : iterate(v)) {
           out += (first ? "" : separator) +
                  to_str(attribute.is_string() ? attribute_path(item, attribute.as_string()) : item);
           first = false;
         }
         return Value(std::move(out));
       }},
      {"last",
       [](const Value& v, CallArguments&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
       }},
      {"length", [](const Value& v, CallArguments&) { return Value(length(v)); }},
      {"list", [](const Value& v, CallArguments&) { return Value(iterate(v)); }},
      {"lower", [](const Value& v, CallArguments&) { return Value(python_lower(to_str(v))); }},
      {"map", map_filter},
      {"max",
       [](const Value& v, CallArguments& a) {
         const List items = sorted(iterate(v), true, truthy(argument(a, 0, "case_sensitive", Value(false))),
                                   argument(a, 1, "attribute"));
         return items.empty() ? Value::undefined("No aggregated item, sequence was empty.") : items.front();
       }},
      {"min",
       [](const Value& v, CallArguments& a) {
         const List items = sorted(iterate(v), false, truthy(argument(a, 0, "case_sensitive", Value(false))),
                                   argument(a, 1, "attribute"));
         return items.empty() ? Value::undefined("No aggregated item, sequence was empty.") : items.front();
       }},
      {"reject", [](const Value& v, CallArguments& a) { return Value(select(v, a, false, false)); }},
      {"rejectattr", [](const Value& v, CallArguments& a) { return Value(select(v, a, true, false)); }},
      {"replace",
       [](const Value& v, CallArguments& a) {
         CallArguments method_args;
         method_args.positional = {argument(a, 0, "old"), argument(a, 1, "new")};
         const Value count = argument(a, 2, "count", Value::none());
         if (!count.is_none()) method_args.positional.push_back(count);
         return get_attribute(Value(to_str(v)), "replace").as_function().call(method_args);
       }},
      {"reverse",
       [](const Value& v, CallArguments&) {
         if (v.is_string()) {
           std::u32string cps = to_code_points(v.as_string());
           std::reverse(cps.begin(), cps.end());
           return Value(from_code_points(cps));
         }
         List items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value(std::move(items));
       }},
      {"round",
       [](const Value& v, CallArguments& a) {
         return python_round(v, argument(a, 0, "precision", Value(0)).as_int(),
                             to_str(argument(a, 1, "method", Value("common"))));
       }},
      {"safe", [](const Value& v, CallArguments&) { return v; }},
      {"select", [](const Value& v, CallArguments& a) { return Value(select(v, a, false, true)); }},
      {"selectattr", [](const Value& v, CallArguments& a) { return Value(select(v, a, true, true)); }},
      {"sort",
       [](const Value& v, CallArguments& a) {
         return Value(sorted(iterate(v), truthy(argument(a, 0, "reverse", Value(false))),
                             truthy(argument(a, 1, "case_sensitive", Value(false))), argument(a, 2, "attribute")));
       }},
      {"string", [](const Value& v, CallArguments&) { return Value(to_str(v)); }},
      {"sum",
       [](const Value& v, CallArguments& a) {
         const Value attribute = argument(a, 0, "attribute");
         Value total = argument(a, 1, "start", Value(0));
         for (const Value& item : iterate(v))
           total =
               binary_operation("+", total, attribute.is_string() ? attribute_path(item, attribute.as_string()) : item);
         return total;
       }},
      {"title", [](const Value& v, CallArguments&) { return Value(jinja_title(to_str(v))); }},
      {"tojson", tojson},
      {"trim",
       [](const Value& v, CallArguments& a) {
         return Value(python_strip(to_str(v), argument(a, 0, "chars", Value::none()), true, true));
       }},
      {"unique",
       [](const Value& v, CallArguments& a) {
         const bool case_sensitive = truthy(argument(a, 0, "case_sensitive", Value(false)));
         const Value attribute = argument(a, 1, "attribute");
         List out, seen;
         for (const Value& item : iterate(v)) {
           const Value key =
               sort_key(attribute.is_string() ? attribute_path(item, attribute.as_string()) : item, case_sensitive);
           if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
           seen.push_back(key);
           out.push_back(item);
         }
         return Value(std::move(out));
       }},
      {"upper", [](const Value& v, CallArguments&) { return Value(python_upper(to_str(v))); }},
      {"wordcount",
       [](const Value& v, CallArguments&) {
         int64_t words = 0;
         bool in_word = false;
         for (const char32_t c : to_code_points(to_str(v))) {
           const bool word_char = c == '_' || (c < 128 ? std::isalnum(static_cast<int>(c)) != 0 : c > 127);
           if (word_char && !in_word) ++words;
           in_word = word_char;
         }
         return Value(words);
       }},
  };
  return table;
}

const std::unordered_map<std::string_view, std::string_view>& filter_aliases() {
  static const std::unordered_map<std::string_view, std::string_view> aliases = {
      {"d", "default"}, {"e", "escape"}, {"forceescape", "escape"}};
  return aliases;
}

using TestFunction = bool (*)(const Value&, CallArguments&);

bool is_integer(const Value& v) { return v.is_int(); }
int compare_with(const Value& v, CallArguments& a, std::string_view op) {
  return compare(v, argument(a, 0, "other"), op);
}

const std::unordered_map<std::string_view, TestFunction>& tests() {
  static const std::unordered_map<std::string_view, TestFunction> table = {
      {"boolean", [](const Value& v, CallArguments&) { return v.is_bool(); }},
      {"callable", [](const Value& v, CallArguments&) { return v.is_callable(); }},
      {"defined", [](const Value& v, CallArguments&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArguments&) { return v.is_undefined(); }},
      {"divisibleby",
       [](const Value& v, CallArguments& a) {
         const Value n = argument(a, 0, "num");
         return binary_operation("%", v, n).as_double() == 0;
       }},
      {"eq", [](const Value& v, CallArguments& a) { return equals(v, argument(a, 0, "other")); }},
      {"ne", [](const Value& v, CallArguments& a) { return !equals(v, argument(a, 0, "other")); }},
      {"lt", [](const Value& v, CallArguments& a) { return compare_with(v, a, "<") < 0; }},
      {"le", [](const Value& v, CallArguments& a) { return compare_with(v, a, "<=") <= 0; }},
      {"gt", [](const Value& v, CallArguments& a) { return compare_with(v, a, ">") > 0; }},
      {"ge", [](const Value& v, CallArguments& a) { return compare_with(v, a, ">=") >= 0; }},
      {"even", [](const Value& v, CallArguments&) { return binary_operation("%", v, Value(2)).as_double() == 0; }},
      {"odd", [](const Value& v, CallArguments&) { return binary_operation("%", v, Value(2)).as_double() == 1; }},
      {"false", [](const Value& v, CallArguments&) { return v.is_bool() && !v.as_bool(); }},
      {"true", [](const Value& v, CallArguments&) { return v.is_bool() && v.as_bool(); }},
      {"filter", [](const Value& v, CallArguments&) { return v.is_string() && is_known_filter(v.as_string()); }},
      {"test", [](const Value& v, CallArguments&) { return v.is_string() && is_known_test(v.as_string()); }},
      {"float", [](const Value& v, CallArguments&) { return v.is_float(); }},
      {"integer", [](const Value& v, CallArguments&) { return is_integer(v); }},
      {"number", [](const Value& v, CallArguments&) { return v.is_number(); }},
      {"in", [](const Value& v, CallArguments& a) { return contains(argument(a, 0, "seq"), v); }},
      {"iterable",
       [](const Value& v, CallArguments&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"sequence",
       [](const Value& v, CallArguments&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"mapping", [](const Value& v, CallArguments&) { return v.is_dict(); }},
      {"string", [](const Value& v, CallArguments&) { return v.is_string(); }},
      {"none", [](const Value& v, CallArguments&) { return v.is_none(); }},
      {"lower",
       [](const Value& v, CallArguments&) { return v.is_string() && python_lower(v.as_string()) == v.as_string(); }},
      {"upper",
       [](const Value& v, CallArguments&) { return v.is_string() && python_upper(v.as_string()) == v.as_string(); }},
      {"sameas",
       [](const Value& v, CallArguments& a) {
         const Value other = argument(a, 0, "other");
         if (v.is_none() || v.is_bool() || v.is_undefined()) return v.kind() == other.kind() && equals(v, other);
         return v.kind() == other.kind() && equals(v, other) && (v.is_int() || v.is_string());
       }},
  };
  return table;
}

const std::unordered_map<std::string_view, std::string_view>& test_aliases() {
  static const std::unordered_map<std::string_view, std::string_view> aliases = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"},          {"<", "lt"}, {"lessthan", "lt"},
      {"<=", "le"}, {">", "gt"},       {"greaterthan", "gt"}, {">=", "ge"}};
  return aliases;
}

std::string_view resolve(std::string_view name, const std::unordered_map<std::string_view, std::string_view>& aliases) {
  const auto alias = aliases.find(name);
  return alias == aliases.end() ? name : alias->second;
}

}  // namespace

bool is_known_filter(std::string_view name) { return filters().count(resolve(name, filter_aliases())) != 0; }
bool is_known_test(std::string_view name) { return tests().count(resolve(name, test_aliases())) != 0; }

Value apply_filter(std::string_view name, const Value& subject, CallArguments& args) {
  const auto it = filters().find(resolve(name, filter_aliases()));
  if (it == filters().end()) fail_unsupported(str_cat("the filter '", name, "'"));
  // Filters other than these fail on undefined input the way jinja2's do: by using it.
  return it->second(subject, args);
}

bool apply_test(std::string_view name, const Value& subject, CallArguments& args) {
  const auto it = tests().find(resolve(name, test_aliases()));
  if (it == tests().end()) fail_unsupported(str_cat("the test '", name, "'"));
  return it->second(subject, args);
}

}  // namespace microllm::jinja
