// The evaluator: renders a parsed template with jinja2's semantics as transformers runs it (an immutable
// sandbox; the loopcontrols extension for break/continue; raise_exception and strftime_now as globals).
// Scoping follows jinja2: each for-loop iteration and each macro call has its own scope, so a `set` inside
// them is not seen outside (hence namespace()); `if` bodies share their enclosing scope; macros read the
// variables of the scope they were defined in as they are when called.
#include <algorithm>
#include <ctime>
#include <map>

#include "microllm/core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_template.h"

namespace microllm::jinja {

namespace {

constexpr int kMaxCallDepth = 200;             // macro recursion
constexpr int64_t kMaxRangeLength = 1000000;   // range() results
constexpr size_t kMaxOutputBytes = 64u << 20;  // a rendering's text
constexpr int64_t kMaxSteps = 20000000;        // statements and expressions evaluated in one rendering

struct Scope {
  std::shared_ptr<Scope> parent;
  std::map<std::string, Value, std::less<>> variables;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      const auto it = s->variables.find(name);
      if (it != s->variables.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(ScopePtr parent) {
  auto s = std::make_shared<Scope>();
  s->parent = std::move(parent);
  return s;
}

enum class Flow { normal, break_loop, continue_loop };

Value function_value(std::string name, std::function<Value(CallArguments&)> call) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
}

std::string strftime_at(const std::string& format, const RenderOptions& options) {
  std::tm broken_down{};
  if (options.now_unix_seconds) {
    const std::time_t t = static_cast<std::time_t>(*options.now_unix_seconds);
    gmtime_r(&t, &broken_down);
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &broken_down);
  }
  std::string out(256 + format.size() * 8, '\0');
  const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &broken_down);
  if (n == 0 && !format.empty()) fail("ValueError: strftime_now: the format gives no text or too much");
  out.resize(n);
  return out;
}

class Renderer {
 public:
  Renderer(const Dict& variables, const RenderOptions& options) : options_(options) {
    globals_ = std::make_shared<Scope>();
    install_builtins();
    root_ = child_of(globals_);
    for (const auto& [name, value] : variables.entries) root_->variables[name] = value;
  }

  // Macros hold the scope they were defined in, which holds them, and a namespace can hold itself: the
  // cycles are broken here, when the rendering's values are no longer needed.
  ~Renderer() {
    for (const ScopePtr& scope : macro_scopes_) scope->variables.clear();
    for (const NamespacePtr& ns : namespaces_) ns->entries.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string render(const Body& body) {
    std::string out;
    try {
      exec(body, root_, out);
    } catch (const TemplateError& e) {
      const std::string message = str_cat("line ", position_.line, ", column ", position_.column, ": ", e.what());
      if (e.unsupported()) throw NotSupportedError("chat_template", message + " is not supported");
      throw ValueError("chat_template", message);
    }
    return out;
  }

 private:
  void install_builtins() {
    auto add = [&](const std::string& name, std::function<Value(CallArguments&)> call) {
      globals_->variables[name] = function_value(name, std::move(call));
    };
    add("raise_exception", [](CallArguments& a) -> Value { fail(to_str(argument(a, 0, "message"))); });
    add("strftime_now", [this](CallArguments& a) {
      check_arguments(a, "strftime_now", 1);
      return Value(strftime_at(to_str(argument(a, 0, "format")), options_));
    });
    add("namespace", [this](CallArguments& a) {
      auto dict = std::make_shared<Dict>();
      namespaces_.push_back(dict);
      for (const Value& initial : a.positional) {
        if (!initial.is_dict()) fail("TypeError: namespace() takes a mapping as its positional argument");
        for (const auto& [key, value] : initial.as_dict().entries) dict->set(key, value);
      }
      for (const auto& [key, value] : a.keyword) dict->set(key, value);
      return Value(Namespace{dict});
    });
    add("dict", [](CallArguments& a) {
      Dict dict;
      if (!a.positional.empty()) fail_unsupported("dict() with positional arguments");
      for (const auto& [key, value] : a.keyword) dict.set(key, value);
      return Value(std::move(dict));
    });
    add("range", [](CallArguments& a) {
      check_arguments(a, "range", 3);
      for (const Value& v : a.positional) {
        if (!v.is_int() && !v.is_bool())
          fail(str_cat("TypeError: '", type_name(v), "' object cannot be interpreted as an integer"));
      }
      if (a.positional.empty()) fail("TypeError: range expected at least 1 argument, got 0");
      const bool one = a.positional.size() == 1;
      const int64_t start = one ? 0 : a.positional[0].as_int();
      const int64_t stop = one ? a.positional[0].as_int() : a.positional[1].as_int();
      const int64_t step = a.positional.size() == 3 ? a.positional[2].as_int() : 1;
      if (step == 0) fail("ValueError: range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) == kMaxRangeLength) fail_unsupported("range() longer than 1000000 items");
        out.emplace_back(i);
      }
      return Value(std::move(out));
    });
    for (const char* name : {"cycler", "joiner", "lipsum"}) {
      add(name, [name](CallArguments&) -> Value { fail_unsupported(str_cat("the global function '", name, "'")); });
    }
  }

  // ---- statements ----

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const NodePtr& node : body) {
      const Flow flow = exec_node(*node, scope, out);
      if (flow != Flow::normal) return flow;
      if (out.size() > kMaxOutputBytes) fail_unsupported("a rendering longer than 64 MiB");
    }
    return Flow::normal;
  }

  void count_step() {
    if (++steps_ > kMaxSteps) fail_unsupported("a rendering of more than 20 million steps");
  }

  Flow exec_node(const Node& node, const ScopePtr& scope, std::string& out) {
    position_ = node.position;
    count_step();
    switch (node.kind) {
      case Node::Kind::text: out += node.text; return Flow::normal;
      case Node::Kind::output: out += to_str(eval(*node.expr, scope)); return Flow::normal;
      case Node::Kind::if_:
        for (const auto& [condition, body] : node.branches) {
          if (!condition || truthy(eval(*condition, scope))) return exec(body, scope, out);
        }
        return Flow::normal;
      case Node::Kind::for_: exec_for(node, scope, out); return Flow::normal;
      case Node::Kind::set: exec_set(node, scope); return Flow::normal;
      case Node::Kind::set_block: {
        std::string text;
        exec(node.body, scope, text);
        position_ = node.position;
        scope->variables[node.targets[0]] =
            node.expr ? apply_filter_chain(*node.expr, Value(text), scope) : Value(text);
        return Flow::normal;
      }
      case Node::Kind::macro: scope->variables[node.name] = make_macro(node, scope); return Flow::normal;
      case Node::Kind::call_block: {
        const Value caller = make_macro(node, scope, "caller");
        out += to_str(eval_call(*node.expr, scope, &caller));
        return Flow::normal;
      }
      case Node::Kind::filter_block: {
        std::string text;
        exec(node.body, scope, text);
        position_ = node.position;
        out += to_str(apply_filter_chain(*node.expr, Value(text), scope));
        return Flow::normal;
      }
      case Node::Kind::break_: return Flow::break_loop;
      case Node::Kind::continue_: return Flow::continue_loop;
      case Node::Kind::generation: return exec(node.body, scope, out);
    }
    return Flow::normal;
  }

  void exec_for(const Node& node, const ScopePtr& scope, std::string& out) {
    List items = iterate(eval(*node.expr, scope));
    if (node.condition) {  // `for x in xs if cond`: loop.* counts the kept items only
      List kept;
      for (const Value& item : items) {
        const ScopePtr filter_scope = child_of(scope);
        bind_targets(node, item, *filter_scope);
        if (truthy(eval(*node.condition, filter_scope))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(node.else_body, scope, out);
      return;
    }
    const auto n = static_cast<int64_t>(items.size());
    const auto shared_items = std::make_shared<const List>(items);
    for (int64_t i = 0; i < n; ++i) {
      const ScopePtr iteration = child_of(scope);
      bind_targets(node, items[static_cast<size_t>(i)], *iteration);
      iteration->variables["loop"] = loop_object(shared_items, i);
      const Flow flow = exec(node.body, iteration, out);
      if (flow == Flow::break_loop) break;
    }
  }

  void bind_targets(const Node& node, const Value& item, Scope& scope) {
    if (node.targets.size() == 1) {
      scope.variables[node.targets[0]] = item;
      return;
    }
    const List parts = iterate(item);
    if (parts.size() != node.targets.size()) {
      fail(str_cat("ValueError: ", parts.size() < node.targets.size() ? "not enough" : "too many",
                   " values to unpack (expected ", node.targets.size(), ", got ", parts.size(), ")"));
    }
    for (size_t k = 0; k < parts.size(); ++k) scope.variables[node.targets[k]] = parts[k];
  }

  static Value loop_object(const std::shared_ptr<const List>& items, int64_t i) {
    const auto n = static_cast<int64_t>(items->size());
    Dict loop;
    loop.entries = {
        {"index", Value(i + 1)},
        {"index0", Value(i)},
        {"revindex", Value(n - i)},
        {"revindex0", Value(n - i - 1)},
        {"first", Value(i == 0)},
        {"last", Value(i == n - 1)},
        {"length", Value(n)},
        {"depth", Value(1)},
        {"depth0", Value(0)},
        {"previtem", i > 0 ? (*items)[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item")},
        {"nextitem", i + 1 < n ? (*items)[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item")},
        {"cycle", function_value("loop.cycle",
                                 [i](CallArguments& a) {
                                   if (a.positional.empty()) fail("TypeError: no items for cycling given");
                                   return a.positional[static_cast<size_t>(i) % a.positional.size()];
                                 })},
    };
    return Value(std::move(loop));
  }

  void exec_set(const Node& node, const ScopePtr& scope) {
    Value value = eval(*node.expr, scope);
    position_ = node.position;
    if (!node.attribute.empty()) {
      const Value* target = scope->find(node.targets[0]);
      if (target == nullptr || !target->is_namespace()) {
        fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
      }
      target->as_namespace()->set(node.attribute, std::move(value));
      return;
    }
    if (node.targets.size() == 1) {
      scope->variables[node.targets[0]] = std::move(value);
      return;
    }
    Node unpack;
    unpack.targets = node.targets;
    bind_targets(unpack, value, *scope);
  }

  // A macro (or a call block's caller) as a callable: its parameters bound in a scope below the one it was
  // defined in.
  Value make_macro(const Node& node, const ScopePtr& defined_in, std::string name = {}) {
    if (name.empty()) name = node.name;
    macro_scopes_.push_back(defined_in);
    return function_value(name, [this, &node, defined_in, name](CallArguments& args) {
      if (++call_depth_ > kMaxCallDepth) fail_unsupported("macro recursion deeper than 200 calls");
      const SourcePosition caller_position = position_;
      const ScopePtr scope = child_of(defined_in);
      if (args.positional.size() > node.parameters.size()) {
        fail(str_cat("TypeError: macro '", name, "' takes not more than ", node.parameters.size(), " argument(s)"));
      }
      for (const auto& entry : args.keyword) {  // (clang 14 cannot capture a structured binding)
        const std::string& keyword = entry.first;
        const bool known =
            keyword == "caller" || std::any_of(node.parameters.begin(), node.parameters.end(),
                                               [&](const MacroParameter& p) { return p.name == keyword; });
        if (!known) fail(str_cat("TypeError: macro '", name, "' takes no keyword argument '", keyword, "'"));
        scope->variables[keyword] = entry.second;
      }
      for (size_t i = 0; i < node.parameters.size(); ++i) {
        const MacroParameter& p = node.parameters[i];
        if (i < args.positional.size()) {
          scope->variables[p.name] = args.positional[i];
        } else if (scope->variables.count(p.name) == 0) {
          scope->variables[p.name] = p.default_value ? eval(*p.default_value, scope)
                                                     : Value::undefined(str_cat("'", p.name, "' is undefined"));
        }
      }
      std::string text;
      exec(node.body, scope, text);
      position_ = caller_position;
      --call_depth_;
      return Value(std::move(text));
    });
  }

  // ---- expressions ----

  Value lookup(const ScopePtr& scope, const std::string& name) {
    if (const Value* v = scope->find(name)) return *v;
    return Value::undefined(str_cat("'", name, "' is undefined"));
  }

  CallArguments eval_arguments(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArguments args;
    for (size_t i = first; i < e.operands.size(); ++i) {
      const Expr& operand = *e.operands[i];
      if (operand.kind == Expr::Kind::unpack_positional) {
        for (Value& v : iterate(eval(*operand.operands[0], scope))) args.positional.push_back(std::move(v));
      } else if (operand.kind == Expr::Kind::unpack_keywords) {
        const Value mapping = eval(*operand.operands[0], scope);
        if (!mapping.is_dict())
          fail(str_cat("TypeError: argument after ** must be a mapping, not ", type_name(mapping)));
        for (const auto& [name, value] : mapping.as_dict().entries) args.keyword.emplace_back(name, value);
      } else {
        args.positional.push_back(eval(operand, scope));
      }
    }
    for (const auto& [name, value] : e.keywords) args.keyword.emplace_back(name, eval(*value, scope));
    return args;
  }

  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
    const Value callee = eval(*e.operands[0], scope);
    CallArguments args = eval_arguments(e, 1, scope);
    if (caller != nullptr) args.keyword.emplace_back("caller", *caller);
    position_ = e.position;
    if (callee.is_undefined()) fail("UndefinedError: " + callee.undefined_hint());
    if (!callee.is_callable()) fail(str_cat("TypeError: '", type_name(callee), "' object is not callable"));
    return callee.as_function().call(args);
  }

  // A filter chain over a value (a `{% filter %}` or `{% set x | f %}` body): the chain's innermost operand
  // is a placeholder for `input`.
  Value apply_filter_chain(const Expr& chain, const Value& input, const ScopePtr& scope) {
    if (chain.kind != Expr::Kind::filter) return input;
    const Value subject = apply_filter_chain(*chain.operands[0], input, scope);
    CallArguments args = eval_arguments(chain, 1, scope);
    position_ = chain.position;
    return apply_filter(chain.name, subject, args);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    position_ = e.position;
    count_step();
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(scope, e.name);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const ExprPtr& operand : e.operands) items.push_back(eval(*operand, scope));
        return e.kind == Expr::Kind::tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
      }
      case Expr::Kind::dict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          const Value key = eval(*e.operands[i], scope);
          if (!key.is_string()) fail_unsupported("a dict key that is not a string");
          dict.set(key.as_string(), eval(*e.operands[i + 1], scope));
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::attribute: {
        const Value object = eval(*e.operands[0], scope);
        position_ = e.position;
        return get_attribute(object, e.name);
      }
      case Expr::Kind::item: {
        const Value object = eval(*e.operands[0], scope);
        const Value key = eval(*e.operands[1], scope);
        position_ = e.position;
        return get_item(object, key);
      }
      case Expr::Kind::slice: {
        const Value object = eval(*e.operands[0], scope);
        Value bounds[3];
        for (int i = 0; i < 3; ++i) {
          if (e.operands[static_cast<size_t>(i) + 1]) bounds[i] = eval(*e.operands[static_cast<size_t>(i) + 1], scope);
        }
        position_ = e.position;
        return slice(object, bounds[0], bounds[1], bounds[2]);
      }
      case Expr::Kind::call: return eval_call(e, scope, nullptr);
      case Expr::Kind::filter: {
        const Value subject = eval(*e.operands[0], scope);
        CallArguments args = eval_arguments(e, 1, scope);
        position_ = e.position;
        return apply_filter(e.name, subject, args);
      }
      case Expr::Kind::test: {
        const Value subject = eval(*e.operands[0], scope);
        CallArguments args = eval_arguments(e, 1, scope);
        position_ = e.position;
        return Value(apply_test(e.name, subject, args));
      }
      case Expr::Kind::negate: {
        const Value v = eval(*e.operands[0], scope);
        position_ = e.position;
        return negate(v);
      }
      case Expr::Kind::unary_plus: {
        const Value v = eval(*e.operands[0], scope);
        position_ = e.position;
        if (!v.is_number()) fail(str_cat("TypeError: bad operand type for unary +: '", type_name(v), "'"));
        return v.is_bool() ? Value(v.as_int()) : v;
      }
      case Expr::Kind::logical_not: return Value(!truthy(eval(*e.operands[0], scope)));
      case Expr::Kind::binary: {
        const Value a = eval(*e.operands[0], scope);
        const Value b = eval(*e.operands[1], scope);
        position_ = e.position;
        if (e.name == "~") return Value(to_str(a) + to_str(b));
        return binary_operation(e.name, a, b);
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.operands[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.operands[i + 1], scope);
          position_ = e.position;
          if (!compare_once(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::logical_and: {
        Value left = eval(*e.operands[0], scope);
        return truthy(left) ? eval(*e.operands[1], scope) : left;
      }
      case Expr::Kind::logical_or: {
        Value left = eval(*e.operands[0], scope);
        return truthy(left) ? left : eval(*e.operands[1], scope);
      }
      case Expr::Kind::unpack_positional:
      case Expr::Kind::unpack_keywords: fail("SyntaxError: * and ** unpack only a call's arguments");
      case Expr::Kind::conditional:
        if (truthy(eval(*e.operands[0], scope))) return eval(*e.operands[1], scope);
        return e.operands[2] ? eval(*e.operands[2], scope) : Value::undefined("the conditional expression has no else");
    }
    return Value();
  }

  static bool compare_once(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    const int c = compare(a, b, op);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  const RenderOptions& options_;
  ScopePtr globals_, root_;
  SourcePosition position_;
  int call_depth_ = 0;
  int64_t steps_ = 0;
  std::vector<ScopePtr> macro_scopes_;
  std::vector<NamespacePtr> namespaces_;
};

void collect_names(const Expr& e, std::set<std::string>& names) {
  if (e.kind == Expr::Kind::name) names.insert(e.name);
  for (const ExprPtr& operand : e.operands) {
    if (operand) collect_names(*operand, names);
  }
  for (const auto& [keyword, value] : e.keywords) collect_names(*value, names);
}

void collect_names(const Body& body, std::set<std::string>& names) {
  for (const NodePtr& node : body) {
    for (const Expr* e : {node->expr.get(), node->condition.get()}) {
      if (e) collect_names(*e, names);
    }
    for (const auto& [condition, branch] : node->branches) {
      if (condition) collect_names(*condition, names);
      collect_names(branch, names);
    }
    for (const MacroParameter& p : node->parameters) {
      if (p.default_value) collect_names(*p.default_value, names);
    }
    collect_names(node->body, names);
    collect_names(node->else_body, names);
  }
}

}  // namespace

Template::Template(std::string_view source) : body_(parse_template(source)) { collect_names(body_, names_); }

std::string Template::render(const Dict& variables, const RenderOptions& options) const {
  return Renderer(variables, options).render(body_);
}

}  // namespace microllm::jinja
