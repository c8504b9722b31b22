// Python's operators, attribute and item lookup, and the methods of str, dict and list that templates call,
// over jinja::Value. Messages follow Python's (TypeError: can only concatenate str (not "int") to str).
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "microllm/core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/unicode.h"

namespace microllm::jinja {

using tokenizer_detail::is_python_space;

// ---- strings ----

std::u32string to_code_points(std::string_view s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) out += tokenizer_detail::utf8_next(s, i);
  return out;
}

std::string from_code_points(std::u32string_view s) {
  std::string out;
  for (const char32_t cp : s) tokenizer_detail::utf8_append(out, cp);
  return out;
}

namespace {

char32_t upper_of(char32_t cp) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))); }
char32_t lower_of(char32_t cp) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))); }
bool is_cased(char32_t cp) {
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
bool is_space(char32_t cp) { return is_python_space(cp) || (cp >= 0x1c && cp <= 0x1f); }

// str.title(): a cased character after an uncased one starts a word.
std::string python_title(std::string_view s) {
  std::u32string cps = to_code_points(s);
  bool previous_cased = false;
  for (char32_t& cp : cps) {
    const bool cased = is_cased(cp);
    cp = previous_cased ? lower_of(cp) : upper_of(cp);
    previous_cased = cased;
  }
  return from_code_points(cps);
}

std::string python_capitalize(std::string_view s) {
  std::u32string cps = to_code_points(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? upper_of(cps[i]) : lower_of(cps[i]);
  return from_code_points(cps);
}

const std::string& string_argument(const Value& v, std::string_view function) {
  if (!v.is_string()) fail(str_cat(function, "() argument must be str, not ", type_name(v)));
  return v.as_string();
}

// str.split(sep, maxsplit) / str.rsplit: sep none splits on runs of whitespace and drops empty parts.
List python_split(const std::string& s, const Value& separator, int64_t max_split, bool from_right) {
  List parts;
  if (separator.is_none() || separator.is_undefined()) {
    std::u32string cps = to_code_points(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (i < cps.size()) {
        while (i < cps.size() && is_space(cps[i])) ++i;
        if (i == cps.size()) break;
        if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
          size_t end = cps.size();
          while (end > i && is_space(cps[end - 1])) --end;
          words.push_back(cps.substr(i, end - i));
          break;
        }
        const size_t start = i;
        while (i < cps.size() && !is_space(cps[i])) ++i;
        words.push_back(cps.substr(start, i - start));
      }
    } else {
      size_t i = cps.size();
      while (i > 0) {
        while (i > 0 && is_space(cps[i - 1])) --i;
        if (i == 0) break;
        if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
          size_t begin = 0;
          while (begin < i && is_space(cps[begin])) ++begin;
          words.push_back(cps.substr(begin, i - begin));
          break;
        }
        const size_t end = i;
        while (i > 0 && !is_space(cps[i - 1])) --i;
        words.push_back(cps.substr(i, end - i));
      }
      std::reverse(words.begin(), words.end());
    }
    for (const auto& w : words) parts.emplace_back(from_code_points(w));
    return parts;
  }
  const std::string& sep = string_argument(separator, "split");
  if (sep.empty()) fail("ValueError: empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    for (size_t at = s.find(sep); at != std::string::npos; at = s.find(sep, start)) {
      if (max_split >= 0 && static_cast<int64_t>(pieces.size()) == max_split) break;
      pieces.push_back(s.substr(start, at - start));
      start = at + sep.size();
    }
    pieces.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (true) {
      if (max_split >= 0 && static_cast<int64_t>(pieces.size()) == max_split) break;
      if (end < sep.size()) break;
      const size_t at = s.rfind(sep, end - sep.size());
      if (at == std::string::npos) break;
      pieces.push_back(s.substr(at + sep.size(), end - at - sep.size()));
      end = at;
    }
    pieces.push_back(s.substr(0, end));
    std::reverse(pieces.begin(), pieces.end());
  }
  for (auto& p : pieces) parts.emplace_back(std::move(p));
  return parts;
}

std::string python_replace(const std::string& s, const std::string& old, const std::string& replacement,
                           int64_t count) {
  std::string out;
  if (old.empty()) {  // inserted before every character and at the end
    const std::u32string cps = to_code_points(s);
    int64_t done = 0;
    for (const char32_t cp : cps) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      tokenizer_detail::utf8_append(out, cp);
    }
    if (count < 0 || done < count) out += replacement;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  for (size_t at = s.find(old); at != std::string::npos && (count < 0 || done < count); at = s.find(old, start)) {
    out += s.substr(start, at - start) + replacement;
    start = at + old.size();
    ++done;
  }
  return out + s.substr(start);
}

// str.format with {}, {0} and {name} fields (no format specs or conversions).
std::string python_format(const std::string& format, CallArguments& args) {
  std::string out;
  size_t automatic = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if ((c == '{' || c == '}') && i + 1 < format.size() && format[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') fail("ValueError: Single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) fail("ValueError: Single '{' encountered in format string");
    const std::string field = format.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      fail_unsupported(str_cat("str.format field '{", field, "}': format specs, conversions and lookups"));
    }
    const Value* value = nullptr;
    if (field.empty() ||
        std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      const size_t index = field.empty() ? automatic++ : std::stoul(field);
      if (index >= args.positional.size()) fail(str_cat("IndexError: Replacement index ", index, " out of range"));
      value = &args.positional[index];
    } else {
      for (const auto& [name, v] : args.keyword) {
        if (name == field) value = &v;
      }
      if (value == nullptr) fail(str_cat("KeyError: '", field, "'"));
    }
    out += to_str(*value);
    i = close;
  }
  return out;
}

std::string python_join(const std::string& separator, const Value& iterable) {
  std::string out;
  bool first = true;
  for (const Value& v : iterate(iterable)) {
    if (!v.is_string()) fail(str_cat("TypeError: sequence item: expected str instance, ", type_name(v), " found"));
    if (!first) out += separator;
    out += v.as_string();
    first = false;
  }
  return out;
}

bool all_code_points(const std::string& s, bool (*predicate)(char32_t)) {
  const std::u32string cps = to_code_points(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), predicate);
}

List python_splitlines(const std::string& s) {
  List lines;
  const std::u32string cps = to_code_points(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool is_break = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
                          c == 0x2028 || c == 0x2029;
    if (!is_break) continue;
    lines.emplace_back(from_code_points(std::u32string_view(cps).substr(start, i - start)));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) lines.emplace_back(from_code_points(std::u32string_view(cps).substr(start)));
  return lines;
}

Value bound_method(std::string name, std::function<Value(CallArguments&)> call) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
}

bool prefix_test(const std::string& s, const Value& candidates, bool at_start, std::string_view function) {
  auto one = [&](const Value& v) {
    const std::string& p = string_argument(v, function);
    return at_start ? s.starts_with(p) : s.ends_with(p);
  };
  if (candidates.is_list()) {  // Python takes a tuple of prefixes
    return std::any_of(candidates.as_list().begin(), candidates.as_list().end(), one);
  }
  return one(candidates);
}

Value string_method(const std::string& s, const std::string& name) {
  const std::string qualified = "str." + name;
  auto method = [&](auto body) { return bound_method(qualified, body); };
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method([s, start, qualified](CallArguments& a) {
      check_arguments(a, qualified, 1);
      return Value(prefix_test(s, argument(a, 0, ""), start, qualified));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return method([s, right, qualified](CallArguments& a) {
      check_arguments(a, qualified, 2, {"sep", "maxsplit"});
      const Value max_split = argument(a, 1, "maxsplit", Value(-1));
      if (!max_split.is_int()) fail("TypeError: maxsplit must be an integer");
      return Value(python_split(s, argument(a, 0, "sep", Value::none()), max_split.as_int(), right));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method([s, left, right, qualified](CallArguments& a) {
      check_arguments(a, qualified, 1);
      return Value(python_strip(s, argument(a, 0, "", Value::none()), left, right));
    });
  }
  using Transform = std::string (*)(std::string_view);
  static const std::pair<std::string_view, Transform> transforms[] = {
      {"lower", python_lower}, {"upper", python_upper}, {"title", python_title}, {"capitalize", python_capitalize}};
  for (const auto& [transform_name, transform] : transforms) {
    if (name != transform_name) continue;
    return method([s, f = transform, qualified](CallArguments& a) {
      check_arguments(a, qualified, 0);
      return Value(f(s));
    });
  }
  if (name == "replace") {
    return method([s, qualified](CallArguments& a) {
      check_arguments(a, qualified, 3, {"count"});
      const Value count = argument(a, 2, "count", Value(-1));
      return Value(python_replace(s, string_argument(argument(a, 0, ""), qualified),
                                  string_argument(argument(a, 1, ""), qualified), count.as_int()));
    });
  }
  if (name == "format") return method([s](CallArguments& a) { return Value(python_format(s, a)); });
  if (name == "join") {
    return method([s, qualified](CallArguments& a) {
      check_arguments(a, qualified, 1);
      return Value(python_join(s, argument(a, 0, "")));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method([s, name, qualified](CallArguments& a) {
      check_arguments(a, qualified, 1);
      const Value sub_value = argument(a, 0, "");
      const std::string& sub = string_argument(sub_value, qualified);
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(to_code_points(s).size()) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value(n);
      }
      const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (name.ends_with("index")) fail("ValueError: substring not found");
        return Value(-1);
      }
      return Value(static_cast<int64_t>(to_code_points(std::string_view(s).substr(0, at)).size()));
    });
  }
  using Predicate = bool (*)(char32_t);
  static const std::pair<std::string_view, Predicate> predicates[] = {
      {"isspace", [](char32_t c) { return is_space(c); }},
      {"isdigit",
       [](char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND; }},
      {"isalpha",
       [](char32_t c) {
         return utf8proc_category(static_cast<utf8proc_int32_t>(c)) <= UTF8PROC_CATEGORY_LO &&
                utf8proc_category(static_cast<utf8proc_int32_t>(c)) >= UTF8PROC_CATEGORY_LU;
       }},
  };
  for (const auto& [predicate_name, predicate] : predicates) {
    if (name != predicate_name) continue;
    return method([s, p = predicate, qualified](CallArguments& a) {
      check_arguments(a, qualified, 0);
      return Value(all_code_points(s, p));
    });
  }
  if (name == "isupper" || name == "islower") {  // some cased character, and every cased one in that case
    const bool upper = name == "isupper";
    return method([s, upper, qualified](CallArguments& a) {
      check_arguments(a, qualified, 0);
      bool cased = false;
      for (const char32_t cp : to_code_points(s)) {
        if (!is_cased(cp)) continue;
        cased = true;
        if ((upper ? upper_of(cp) : lower_of(cp)) != cp) return Value(false);
      }
      return Value(cased);
    });
  }
  if (name == "splitlines") {
    return method([s, qualified](CallArguments& a) {
      check_arguments(a, qualified, 0);
      return Value(python_splitlines(s));
    });
  }
  static const std::unordered_set<std::string_view> other_methods = {
      "casefold",     "center",    "encode",      "expandtabs", "format_map", "isalnum",   "isascii",   "isdecimal",
      "isidentifier", "isnumeric", "isprintable", "istitle",    "ljust",      "maketrans", "partition", "removeprefix",
      "removesuffix", "rjust",     "rpartition",  "swapcase",   "translate",  "zfill"};
  if (other_methods.count(name)) fail_unsupported(str_cat("the string method '", name, "'"));
  return Value::undefined(str_cat("'str object' has no attribute '", name, "'"));
}

Value dict_method(const Value& object, const std::string& name) {
  const DictPtr dict = std::make_shared<const Dict>(object.as_dict());
  const std::string qualified = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    return bound_method(qualified, [dict, name, qualified](CallArguments& a) {
      check_arguments(a, qualified, 0);
      List out;
      for (const auto& [key, value] : dict->entries) {
        if (name == "items")
          out.push_back(Value::tuple({Value(key), value}));
        else
          out.push_back(name == "keys" ? Value(key) : value);
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return bound_method(qualified, [dict, qualified](CallArguments& a) {
      check_arguments(a, qualified, 2);
      const Value key = argument(a, 0, "");
      const Value* found = key.is_string() ? dict->find(key.as_string()) : nullptr;
      return found ? *found : argument(a, 1, "", Value::none());
    });
  }
  if (name == "copy") return bound_method(qualified, [dict](CallArguments&) { return Value(dict); });
  fail(str_cat("SecurityError: access to attribute '", name, "' of 'dict' object is unsafe."));
}

const std::unordered_set<std::string_view> kDictAttributes = {
    "items", "keys", "values", "get", "copy", "pop", "popitem", "setdefault", "update", "clear", "fromkeys"};
const std::unordered_set<std::string_view> kListMutators = {"append", "extend",  "insert", "pop",
                                                            "remove", "reverse", "sort",   "clear"};

std::string object_name(const Value& v) { return v.is_none() ? "None" : type_name(v) + " object"; }

}  // namespace

// Python's str.upper() and str.lower(): one character to one, except where Unicode's special casing maps a
// character to several (the German sharp s and the Latin ligatures; dotted capital I).
std::string python_upper(std::string_view s) {
  std::string out;
  for (const char32_t cp : to_code_points(s)) {
    switch (cp) {
      case 0x00DF: out += "SS"; break;
      case 0xFB00: out += "FF"; break;
      case 0xFB01: out += "FI"; break;
      case 0xFB02: out += "FL"; break;
      case 0xFB03: out += "FFI"; break;
      case 0xFB04: out += "FFL"; break;
      case 0xFB05:
      case 0xFB06: out += "ST"; break;
      default: tokenizer_detail::utf8_append(out, upper_of(cp));
    }
  }
  return out;
}
std::string python_lower(std::string_view s) {
  std::string out;
  for (const char32_t cp : to_code_points(s)) {
    if (cp == 0x0130) {
      out += "i\u0307";
    } else {
      tokenizer_detail::utf8_append(out, lower_of(cp));
    }
  }
  return out;
}

std::string python_strip(std::string_view s, const Value& chars, bool left, bool right) {
  const std::u32string cps = to_code_points(s);
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = to_code_points(string_argument(chars, "strip"));
  auto strip_it = [&](char32_t c) { return whitespace ? is_space(c) : set.find(c) != std::u32string::npos; };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip_it(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(cps[end - 1])) --end;
  return from_code_points(std::u32string_view(cps).substr(begin, end - begin));
}

// ---- arguments ----

Value argument(CallArguments& args, size_t index, std::string_view name, Value fallback) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [keyword, value] : args.keyword) {
    if (!name.empty() && keyword == name) return value;
  }
  return fallback;
}

void check_arguments(const CallArguments& args, std::string_view function, size_t positional,
                     std::initializer_list<std::string_view> keywords) {
  if (args.positional.size() > positional) {
    fail(str_cat("TypeError: ", function, "() takes at most ", positional, " positional argument(s) (",
                 args.positional.size(), " given)"));
  }
  for (const auto& [keyword, value] : args.keyword) {
    if (std::find(keywords.begin(), keywords.end(), keyword) == keywords.end()) {
      fail(str_cat("TypeError: ", function, "() got an unexpected keyword argument '", keyword, "'"));
    }
  }
}

// ---- lookups ----

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) fail("UndefinedError: " + object.undefined_hint());
  if (!name.empty() && name[0] == '_') {
    return Value::undefined(str_cat("'", object_name(object), "' has no attribute '", name, "'"));
  }
  static const std::unordered_set<std::string_view> number_attributes = {
      "real",      "imag",     "numerator",        "denominator", "conjugate", "bit_length",
      "bit_count", "to_bytes", "as_integer_ratio", "is_integer",  "hex"};
  if (object.is_number() && number_attributes.count(name)) {
    fail_unsupported(str_cat("the attribute '", name, "' of a number"));
  }
  if (object.is_string()) return string_method(object.as_string(), name);
  if (object.is_dict()) {
    if (kDictAttributes.count(name)) return dict_method(object, name);
    if (const Value* v = object.as_dict().find(name)) return *v;
  } else if (object.is_namespace()) {
    if (const Value* v = object.as_dict().find(name)) return *v;
  } else if (object.is_list()) {
    if (kListMutators.count(name))
      fail(str_cat("SecurityError: access to attribute '", name, "' of 'list' object is unsafe."));
    if (name == "index" || name == "count") {
      const ListPtr list = object.list_ptr();
      return bound_method("list." + name, [list, name](CallArguments& a) {
        check_arguments(a, "list." + name, 1);
        const Value x = argument(a, 0, "");
        int64_t count = 0;
        for (size_t i = 0; i < list->size(); ++i) {
          if (!equals((*list)[i], x)) continue;
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++count;
        }
        if (name == "index") fail("ValueError: " + repr(x) + " is not in list");
        return Value(count);
      });
    }
  }
  return Value::undefined(str_cat("'", object_name(object), "' has no attribute '", name, "'"));
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail("UndefinedError: " + object.undefined_hint());
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = length(object);
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
      return Value::undefined(str_cat("'", object_name(object), "' has no element ", key.as_int()));
    }
    if (object.is_list()) return object.as_list()[static_cast<size_t>(i)];
    return Value(from_code_points(to_code_points(object.as_string()).substr(static_cast<size_t>(i), 1)));
  }
  if (object.is_dict() && key.is_string()) {
    if (const Value* v = object.as_dict().find(key.as_string())) return *v;
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(str_cat("'", object_name(object), "' has no element ", repr(key)));
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail("UndefinedError: " + object.undefined_hint());
  if (!object.is_list() && !object.is_string())
    fail(str_cat("TypeError: '", type_name(object), "' object is not subscriptable"));
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail(str_cat("TypeError: slice ", what, " must be an integer or None"));
    return v.as_int();
  };
  const int64_t n = length(object);
  const int64_t s = bound(step, "step").value_or(1);
  if (s == 0) fail("ValueError: slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t absent) {
    if (!v) return absent;
    int64_t i = *v < 0 ? *v + n : *v;
    if (s > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t first = clamp(bound(start, "start"), s > 0 ? 0 : n - 1);
  const int64_t last = clamp(bound(stop, "stop"), s > 0 ? n : -1);
  std::vector<size_t> indices;
  for (int64_t i = first; s > 0 ? i < last : i > last; i += s) indices.push_back(static_cast<size_t>(i));
  if (object.is_list()) {
    List out;
    for (const size_t i : indices) out.push_back(object.as_list()[i]);
    return Value(std::move(out));
  }
  const std::u32string cps = to_code_points(object.as_string());
  std::u32string out;
  for (const size_t i : indices) out += cps[i];
  return Value(from_code_points(out));
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return v.as_list();
    case Value::Kind::dict: {
      List keys;
      for (const auto& entry : v.as_dict().entries) keys.emplace_back(entry.first);
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      for (const char32_t cp : to_code_points(v.as_string()))
        chars.emplace_back(from_code_points(std::u32string(1, cp)));
      return chars;
    }
    default: fail(str_cat("TypeError: '", type_name(v), "' object is not iterable"));
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return 0;
    case Value::Kind::string: return static_cast<int64_t>(to_code_points(v.as_string()).size());
    case Value::Kind::list: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::dict: return static_cast<int64_t>(v.as_dict().entries.size());
    default: fail(str_cat("TypeError: object of type '", type_name(v), "' has no len()"));
  }
}

// ---- operators ----

namespace {

[[noreturn]] void operand_error(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) fail("UndefinedError: " + (a.is_undefined() ? a : b).undefined_hint());
  if (op == "+" && (a.is_string() || a.is_list())) {
    fail(str_cat("TypeError: can only concatenate ", type_name(a), " (not \"", type_name(b), "\") to ", type_name(a)));
  }
  fail(str_cat("TypeError: unsupported operand type(s) for ", op, ": '", type_name(a), "' and '", type_name(b), "'"));
}

[[noreturn]] void overflow() {
  fail_unsupported("integer overflow (Python's integers are unbounded; these are 64-bit)");
}

// a OP b on int64, or the overflow error.
int64_t add_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

// Strings and lists no template needs beyond this size (bytes or items): a bound on what a rendering can allocate.
constexpr int64_t kMaxSequenceSize = int64_t{64} << 20;

void check_size(int64_t size) {
  if (size > kMaxSequenceSize) fail_unsupported("a string or list longer than 64 Mi (bytes or items)");
}

Value repeat(const Value& sequence, int64_t times) {
  check_size(mul_checked(
      std::max<int64_t>(times, 0),
      static_cast<int64_t>(sequence.is_string() ? sequence.as_string().size() : sequence.as_list().size())));
  if (sequence.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return Value(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), sequence.as_list().begin(), sequence.as_list().end());
  return Value(std::move(out));
}

// printf-style `format % args` for %s, %r, %d, %i and %%.
std::string percent_format(const std::string& format, const Value& args) {
  const List values = args.is_list() ? args.as_list() : List{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (i + 1 >= format.size()) fail("ValueError: incomplete format");
    const char spec = format[++i];
    if (spec == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) fail("TypeError: not enough arguments for format string");
    const Value& v = values[next++];
    if (spec == 's')
      out += to_str(v);
    else if (spec == 'r')
      out += repr(v);
    else if ((spec == 'd' || spec == 'i') && v.is_number())
      out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
    else
      fail_unsupported(str_cat("the '%", std::string(1, spec), "' conversion of the % operator"));
  }
  if (next < values.size()) fail("TypeError: not all arguments converted during string formatting");
  return out;
}

}  // namespace

Value binary_operation(std::string_view op, const Value& a, const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = numbers && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value(add_checked(a.as_int(), b.as_int()));
    if (numbers) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(static_cast<int64_t>(a.as_string().size() + b.as_string().size()));
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      check_size(static_cast<int64_t>(a.as_list().size() + b.as_list().size()));
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(out));
    }
  } else if (op == "-") {
    if (ints) return Value(sub_checked(a.as_int(), b.as_int()));
    if (numbers) return Value(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) return Value(mul_checked(a.as_int(), b.as_int()));
    if (numbers) return Value(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  } else if (op == "/") {
    if (numbers) {
      if (b.as_double() == 0) fail("ZeroDivisionError: division by zero");
      return Value(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (numbers) {
      if (b.as_double() == 0)
        fail(op == "//" ? "ZeroDivisionError: integer division or modulo by zero"
                        : "ZeroDivisionError: integer modulo by zero");
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow();
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value(op == "//" ? q : m);
      }
      // Python's float divmod: the remainder takes the divisor's sign.
      const double x = a.as_double(), y = b.as_double();
      double m = std::fmod(x, y);
      double quotient = (x - m) / y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        m += y;
        quotient -= 1.0;
      }
      double floored = std::floor(quotient);
      if (quotient - floored > 0.5) floored += 1.0;
      return Value(op == "//" ? floored : m);
    }
    if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t result = 1;
      for (int64_t i = 0; i < b.as_int() && result != 0; ++i) result = mul_checked(result, a.as_int());
      return Value(result);
    }
    if (numbers) return Value(std::pow(a.as_double(), b.as_double()));
  } else {
    fail_unsupported(str_cat("the operator '", op, "'"));
  }
  operand_error(op, a, b);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::undefined: return false;
    case Value::Kind::string:
      if (!item.is_string())
        fail(str_cat("TypeError: 'in <string>' requires string as left operand, not ", type_name(item)));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::list:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& v) { return equals(v, item); });
    case Value::Kind::dict: return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default: fail(str_cat("TypeError: argument of type '", type_name(container), "' is not iterable"));
  }
}

Value negate(const Value& v) {
  if (v.is_float()) return Value(-v.as_double());
  if (v.is_number()) return Value(sub_checked(0, v.as_int()));
  if (v.is_undefined()) fail("UndefinedError: " + v.undefined_hint());
  fail(str_cat("TypeError: bad operand type for unary -: '", type_name(v), "'"));
}

}  // namespace microllm::jinja
