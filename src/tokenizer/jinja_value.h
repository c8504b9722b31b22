// The values a chat template computes with, and how Python shows them. Jinja runs on Python objects; a chat
// template sees JSON data (messages, tools) and the literals it writes, so the Value type is the JSON types
// plus Undefined, namespaces and callables:
//   undefined   a missing variable, attribute or item (renders as "", is falsy; most operations on it fail)
//   none, boolean, integer (int64), floating (double), string (UTF-8), list, dict (keys are strings, in
//   insertion order as Python keeps them), namespace (the one mutable object: `set ns.x = ...`), callable.
// Lists and dicts are immutable and shared (the sandbox transformers uses forbids mutating them).
// Internal header of the tokenizer layer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace microllm::jinja {

// A failure while rendering (Python would raise TypeError, UndefinedError, TemplateError, ...); the
// evaluator adds the template position. `unsupported` marks what Python does and this engine does not.
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& message, bool unsupported = false)
      : std::runtime_error(message), unsupported_(unsupported) {}
  bool unsupported() const { return unsupported_; }

 private:
  bool unsupported_;
};
[[noreturn]] inline void fail(const std::string& message) { throw TemplateError(message); }
[[noreturn]] inline void fail_unsupported(const std::string& message) { throw TemplateError(message, true); }

class Value;
struct Dict;
struct Function;
struct CallArguments;

using List = std::vector<Value>;
using ListPtr = std::shared_ptr<const List>;
using DictPtr = std::shared_ptr<const Dict>;
using NamespacePtr = std::shared_ptr<Dict>;
using FunctionPtr = std::shared_ptr<const Function>;

struct Undefined {
  std::string hint;  // what is undefined, for messages: "'x' is undefined", "'dict object' has no attribute 'y'"
};
struct None {};
struct Namespace {
  NamespacePtr dict;
};

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, namespace_, callable };

  Value() : data_(Undefined{}) {}
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value none() { return Value(None{}); }
  Value(bool b) : data_(b) {}  // NOLINT: values convert from their C++ types
  Value(int64_t i) : data_(i) {}
  Value(int i) : data_(static_cast<int64_t>(i)) {}
  Value(double d) : data_(d) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(List list) : data_(std::make_shared<const List>(std::move(list))) {}
  Value(ListPtr list) : data_(std::move(list)) {}
  Value(Dict dict);
  Value(DictPtr dict) : data_(std::move(dict)) {}
  Value(Namespace ns) : data_(std::move(ns)) {}
  Value(FunctionPtr function) : data_(std::move(function)) {}
  // A Python tuple: a list that prints as (a, b) (dict items, tuple literals).
  static Value tuple(List items) {
    Value v(std::move(items));
    v.tuple_ = true;
    return v;
  }

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::undefined; }
  bool is_none() const { return kind() == Kind::none; }
  bool is_bool() const { return kind() == Kind::boolean; }
  bool is_int() const { return kind() == Kind::integer; }
  bool is_float() const { return kind() == Kind::floating; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::string; }
  bool is_list() const { return kind() == Kind::list; }
  bool is_dict() const { return kind() == Kind::dict; }
  bool is_namespace() const { return kind() == Kind::namespace_; }
  bool is_callable() const { return kind() == Kind::callable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return is_bool() ? static_cast<int64_t>(as_bool()) : std::get<int64_t>(data_); }
  double as_double() const { return is_float() ? std::get<double>(data_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<ListPtr>(data_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(data_); }
  const Dict& as_dict() const;  // a dict's or a namespace's entries
  const NamespacePtr& as_namespace() const { return std::get<Namespace>(data_).dict; }
  const Function& as_function() const { return *std::get<FunctionPtr>(data_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }
  bool is_tuple() const { return tuple_; }

 private:
  explicit Value(Undefined u) : data_(std::move(u)) {}
  explicit Value(None n) : data_(n) {}
  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, Namespace, FunctionPtr> data_;
  bool tuple_ = false;
};

// Python dict semantics over string keys: insertion order, assignment replaces in place.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

// Arguments of a call, as written: positional, then keyword.
struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A builtin function or a bound method, a macro, a call block's caller.
struct Function {
  std::string name;  // for messages and str(): "raise_exception", "str.split", a macro's name
  std::function<Value(CallArguments&)> call;
};

// Python's type names, as its error messages print them: 'str', 'int', 'NoneType', 'dict', ...
std::string type_name(const Value& v);
// Python truthiness: undefined, none, false, 0, 0.0, "" and empty containers are false.
bool truthy(const Value& v);
// str(v) as Jinja prints it: strings as they are, undefined as "", the rest as Python's repr.
std::string to_str(const Value& v);
// repr(v): 'strings' quoted and escaped as Python does, [1, 'a'], {'k': None}, True.
std::string repr(const Value& v);
// Python ==: 1 == 1.0 == True; lists and dicts element-wise; undefined equals only undefined.
bool equals(const Value& a, const Value& b);
// Python ordering (<0, 0, >0) of numbers, strings (by code point) and lists; TypeError otherwise.
int compare(const Value& a, const Value& b, std::string_view op);
// Python's repr of a float: the shortest text that reads back exactly ("0.1", "1e-05", "1e+16", "2.0").
std::string python_float_repr(double d);

// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...), as transformers' tojson.
struct JsonDumpOptions {
  std::optional<std::string> indent;  // each level's indent (Python's indent=int becomes that many spaces)
  std::optional<std::pair<std::string, std::string>> separators;  // default: (", ", ": "), or (",", ": ") indented
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& options = {});

// A value from JSON text (nlohmann-json parses it); integers past int64 become floats, as far as they go.
Value value_from_json_text(std::string_view json_text, const std::string& what);

}  // namespace microllm::jinja
