// What Jinja and Python give a template beyond its own syntax: operators over values, attribute and item
// lookup (with the methods of str, dict and list), filters and tests. jinja_operators.cpp holds the
// operators, lookups and methods; jinja_filters.cpp the filters and tests. Internal header.
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/jinja_value.h"

namespace microllm::jinja {

// a OP b for + - * / // % ** (Python semantics; TypeError and ZeroDivisionError as TemplateError).
Value binary_operation(std::string_view op, const Value& a, const Value& b);
// `item in container` (substring, list element, dict key).
bool contains(const Value& container, const Value& item);
// -v and +v.
Value negate(const Value& v);

// obj.name as jinja2's sandbox resolves it: an attribute (a method of str, dict or list, a namespace's
// member), else an item; undefined when neither exists. Mutating methods are refused as the sandbox does.
Value get_attribute(const Value& object, const std::string& name);
// obj[key]: an item, else an attribute of that name; undefined when neither exists.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] over a string (by character) or a list; absent bounds are undefined values.
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The elements a for loop or a filter iterates: a list's items, a dict's keys, a string's characters,
// nothing for undefined. TypeError for other values.
List iterate(const Value& v);
// len(v) for strings (characters), lists and dicts.
int64_t length(const Value& v);

// `subject | name(args)`; `subject is name(args)`.
Value apply_filter(std::string_view name, const Value& subject, CallArguments& args);
bool apply_test(std::string_view name, const Value& subject, CallArguments& args);

// Argument reading for builtins: the i-th positional argument or the keyword `name`, else `fallback`.
Value argument(CallArguments& args, size_t index, std::string_view name, Value fallback = Value());
// Fails when arguments beyond the first `positional` ones or other keywords than `keywords` were given.
void check_arguments(const CallArguments& args, std::string_view function, size_t positional,
                     std::initializer_list<std::string_view> keywords = {});

// Python string operations on UTF-8 (by character, Unicode-aware where Python is).
std::u32string to_code_points(std::string_view s);
std::string from_code_points(std::u32string_view s);
std::string python_upper(std::string_view s);
std::string python_lower(std::string_view s);
std::string python_strip(std::string_view s, const Value& chars, bool left, bool right);

}  // namespace microllm::jinja
