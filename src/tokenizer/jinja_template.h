// A parsed Jinja template and its rendering (jinja_eval.cpp): the engine under ChatTemplate. Internal header.
//
//   jinja::Template t("{% for m in messages %}{{ m.content | trim }}{% endfor %}");
//   std::string text = t.render(variables);   // variables: a Dict of name -> Value
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "tokenizer/jinja_ast.h"

namespace microllm::jinja {

struct RenderOptions {
  // The clock strftime_now reads, as seconds since the epoch shown in UTC; unset: now, in local time (as
  // Python's datetime.now()).
  std::optional<int64_t> now_unix_seconds;
};

class Template {
 public:
  // Parses `source`: ParseError for malformed syntax, NotSupportedError for constructs the engine lacks.
  explicit Template(std::string_view source);

  // Renders with `variables` as the template's globals (besides raise_exception, strftime_now, namespace,
  // range and dict). ValueError for what Python raises while rendering (raise_exception's message, an
  // undefined attribute of an undefined value, a type error), NotSupportedError for what Python does and
  // this engine does not; each names the template line and column.
  std::string render(const Dict& variables, const RenderOptions& options = {}) const;

  // Whether the template reads a variable of that name anywhere (`enable_thinking`, `tools`, ...).
  bool reads_variable(std::string_view name) const { return names_.count(std::string(name)) != 0; }

 private:
  Body body_;
  std::set<std::string> names_;
};

}  // namespace microllm::jinja
