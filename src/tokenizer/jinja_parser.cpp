// The Jinja parser: statements and expressions with jinja2's grammar and precedence, lowest first:
//   conditional (x if c else y) < or < and < not < comparisons (== != < <= > >= in, not in; chained)
//   < + - < ~ < * / // % < ** < unary - + < filters (|f), tests (is t) and calls < postfix (.a [i] [a:b] (args))
// Constructs that jinja2 has and this engine lacks are NotSupportedError naming the line, column and construct.
#include <unordered_set>

#include "microllm/core/error.h"
#include "tokenizer/jinja_ast.h"

namespace microllm::jinja {

namespace {

using Type = Token::Type;

ExprPtr make_expr(Expr::Kind kind, SourcePosition position) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->position = position;
  return e;
}

NodePtr make_node(Node::Kind kind, SourcePosition position) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->position = position;
  return n;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({});
    if (current().type != Type::end) {
      // parse_body stopped at a block tag no statement expects.
      unexpected_end_tag();
    }
    return body;
  }

 private:
  // ---- tokens ----

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_operator(std::string_view op) const { return current().type == Type::operator_ && current().text == op; }
  bool at_name(std::string_view name) const { return current().type == Type::name && current().text == name; }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Type::text: return "template text";
      case Type::variable_begin: return "'{{'";
      case Type::variable_end: return "'}}'";
      case Type::block_begin: return "'{%'";
      case Type::block_end: return "'%}'";
      case Type::name: return "'" + t.text + "'";
      case Type::integer:
      case Type::floating: return "the number " + t.text;
      case Type::string: return "a string";
      case Type::operator_: return "'" + t.text + "'";
      case Type::end: return "the end of the template";
    }
    return "?";
  }

  static std::string where(SourcePosition p) { return str_cat("line ", p.line, ", column ", p.column, ": "); }

  [[noreturn]] void syntax_error(const std::string& message) const {
    throw ParseError("chat_template", where(current().position) + message);
  }
  [[noreturn]] static void unsupported(SourcePosition p, const std::string& construct) {
    throw NotSupportedError("chat_template", where(p) + construct);
  }

  void expect_operator(std::string_view op) {
    if (!skip_operator(op)) syntax_error(str_cat("expected '", op, "', found ", describe(current())));
  }
  std::string expect_name(std::string_view what) {
    if (current().type != Type::name) syntax_error(str_cat("expected ", what, ", found ", describe(current())));
    return advance().text;
  }
  void expect(Type type, std::string_view what) {
    if (current().type != type) syntax_error(str_cat("expected ", what, ", found ", describe(current())));
    advance();
  }
  void expect_block_end() { expect(Type::block_end, "'%}'"); }

  [[noreturn]] void unexpected_end_tag() { syntax_error(str_cat("unexpected '{% ", peek().text, " %}'")); }

  // Recursive descent bounded in depth, so that no template exhausts the stack.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxDepth) unsupported(parser.current().position, "nesting deeper than 200 levels");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };
  static constexpr int kMaxDepth = 200;

  // ---- statements ----

  // Nodes up to a block tag whose keyword is in `terminators` (left unconsumed, at its '{%') or the end.
  Body parse_body(std::initializer_list<std::string_view> terminators) {
    Body body;
    while (current().type != Type::end) {
      const Token& t = current();
      if (t.type == Type::text) {
        NodePtr n = make_node(Node::Kind::text, t.position);
        n->text = t.text;
        body.push_back(std::move(n));
        advance();
      } else if (t.type == Type::variable_begin) {
        NodePtr n = make_node(Node::Kind::output, t.position);
        advance();
        n->expr = parse_tuple_or_expression();
        expect(Type::variable_end, "'}}'");
        body.push_back(std::move(n));
      } else if (t.type == Type::block_begin) {
        if (peek().type == Type::name) {
          for (const std::string_view end : terminators) {
            if (peek().text == end) return body;
          }
        }
        if (peek().type == Type::name && ends_a_block(peek().text)) {
          if (terminators.size() == 0) unexpected_end_tag();
          return body;  // the caller reports the mismatch
        }
        body.push_back(parse_statement());
      } else {
        syntax_error("unexpected " + describe(t));
      }
    }
    return body;
  }

  static bool ends_a_block(std::string_view keyword) {
    static const std::unordered_set<std::string_view> ends = {
        "endif", "else", "elif", "endfor", "endmacro", "endcall", "endset", "endfilter", "endgeneration"};
    return ends.count(keyword) != 0;
  }

  // At '{%' + keyword: the tag that closes a block, or an error saying which was expected.
  void expect_end_tag(std::string_view keyword, SourcePosition opened, std::string_view statement) {
    if (current().type == Type::end) {
      throw ParseError("chat_template", str_cat(where(opened), "'{% ", statement, " %}' is never closed (expected '{% ",
                                                keyword, " %}')"));
    }
    advance();  // {%
    if (!at_name(keyword)) syntax_error(str_cat("expected '{% ", keyword, " %}', found ", describe(current())));
    advance();
    expect_block_end();
  }

  NodePtr parse_statement() {
    const DepthGuard guard(*this);
    advance();  // {%
    const Token& keyword = current();
    const SourcePosition at = keyword.position;
    if (keyword.type != Type::name) syntax_error("expected a statement, found " + describe(keyword));
    const std::string name = advance().text;
    if (name == "if") return parse_if(at);
    if (name == "for") return parse_for(at);
    if (name == "set") return parse_set(at);
    if (name == "macro") return parse_macro(at);
    if (name == "call") return parse_call_block(at);
    if (name == "filter") return parse_filter_block(at);
    if (name == "generation") {
      NodePtr n = make_node(Node::Kind::generation, at);
      expect_block_end();
      n->body = parse_body({"endgeneration"});
      expect_end_tag("endgeneration", at, "generation");
      return n;
    }
    if (name == "break" || name == "continue") {
      expect_block_end();
      return make_node(name == "break" ? Node::Kind::break_ : Node::Kind::continue_, at);
    }
    static const std::unordered_set<std::string_view> jinja_statements = {
        "extends", "block", "include", "import", "from", "with", "autoescape", "trans", "raw", "do", "print"};
    if (jinja_statements.count(name)) {
      unsupported(at, str_cat("the '{% ", name, " %}' statement is not supported (transformers' chat templates cannot ",
                              name == "do" ? "use it: the 'do' extension is not enabled" : "use it here", ")"));
    }
    throw ParseError("chat_template", str_cat(where(at), "unknown statement '{% ", name, " %}'"));
  }

  NodePtr parse_if(SourcePosition at) {
    NodePtr n = make_node(Node::Kind::if_, at);
    ExprPtr condition = parse_expression();
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      n->branches.emplace_back(std::move(condition), std::move(body));
      if (current().type == Type::end) expect_end_tag("endif", at, "if");
      const std::string& next = peek().text;
      if (next == "elif") {
        advance(), advance();
        condition = parse_expression();
        expect_block_end();
      } else if (next == "else") {
        advance(), advance();
        expect_block_end();
        n->branches.emplace_back(nullptr, parse_body({"endif"}));
        expect_end_tag("endif", at, "if");
        return n;
      } else {
        expect_end_tag("endif", at, "if");
        return n;
      }
    }
  }

  NodePtr parse_for(SourcePosition at) {
    NodePtr n = make_node(Node::Kind::for_, at);
    n->targets.push_back(expect_name("a loop variable"));
    while (skip_operator(",")) n->targets.push_back(expect_name("a loop variable"));
    if (!skip_name("in")) syntax_error("expected 'in' in the for statement, found " + describe(current()));
    n->expr = parse_tuple_or_expression(/*stop_at_if=*/true);
    if (skip_name("if")) n->condition = parse_expression();
    if (at_name("recursive"))
      unsupported(current().position, "recursive for loops ('{% for ... recursive %}') are not supported");
    expect_block_end();
    n->body = parse_body({"else", "endfor"});
    if (current().type != Type::end && peek().text == "else") {
      advance(), advance();
      expect_block_end();
      n->else_body = parse_body({"endfor"});
    }
    expect_end_tag("endfor", at, "for");
    return n;
  }

  NodePtr parse_set(SourcePosition at) {
    const std::string target = expect_name("a variable name");
    if (skip_operator(".")) {  // set ns.attribute = value
      NodePtr n = make_node(Node::Kind::set, at);
      n->targets.push_back(target);
      n->attribute = expect_name("an attribute name");
      expect_operator("=");
      n->expr = parse_tuple_or_expression();
      expect_block_end();
      return n;
    }
    std::vector<std::string> targets{target};
    while (skip_operator(",")) targets.push_back(expect_name("a variable name"));
    if (targets.size() == 1 && (current().type == Type::block_end || at_operator("|"))) {  // a block set
      NodePtr n = make_node(Node::Kind::set_block, at);
      n->targets = std::move(targets);
      if (at_operator("|")) n->expr = parse_filters(make_expr(Expr::Kind::literal, current().position));
      expect_block_end();
      n->body = parse_body({"endset"});
      expect_end_tag("endset", at, "set");
      return n;
    }
    NodePtr n = make_node(Node::Kind::set, at);
    n->targets = std::move(targets);
    expect_operator("=");
    n->expr = parse_tuple_or_expression();
    expect_block_end();
    return n;
  }

  std::vector<MacroParameter> parse_parameters() {
    std::vector<MacroParameter> parameters;
    expect_operator("(");
    while (!skip_operator(")")) {
      if (!parameters.empty()) expect_operator(",");
      if (skip_operator(")")) break;
      MacroParameter p{expect_name("a parameter name"), nullptr};
      if (skip_operator("=")) p.default_value = parse_expression();
      parameters.push_back(std::move(p));
    }
    return parameters;
  }

  NodePtr parse_macro(SourcePosition at) {
    NodePtr n = make_node(Node::Kind::macro, at);
    n->name = expect_name("a macro name");
    n->parameters = parse_parameters();
    expect_block_end();
    n->body = parse_body({"endmacro"});
    expect_end_tag("endmacro", at, "macro");
    return n;
  }

  NodePtr parse_call_block(SourcePosition at) {
    NodePtr n = make_node(Node::Kind::call_block, at);
    if (at_operator("(")) n->parameters = parse_parameters();
    n->expr = parse_expression();
    if (n->expr->kind != Expr::Kind::call) syntax_error("'{% call %}' needs a macro call");
    expect_block_end();
    n->body = parse_body({"endcall"});
    expect_end_tag("endcall", at, "call");
    return n;
  }

  NodePtr parse_filter_block(SourcePosition at) {
    NodePtr n = make_node(Node::Kind::filter_block, at);
    ExprPtr placeholder = make_expr(Expr::Kind::literal, current().position);
    n->expr = parse_filter(std::move(placeholder));
    while (at_operator("|")) n->expr = parse_filter(std::move(n->expr));
    expect_block_end();
    n->body = parse_body({"endfilter"});
    expect_end_tag("endfilter", at, "filter");
    return n;
  }

  // ---- expressions ----

  // An expression, or a tuple of them without parentheses (`{% set a = 1, 2 %}`, `{{ a, b }}`).
  ExprPtr parse_tuple_or_expression(bool stop_at_if = false) {
    const SourcePosition at = current().position;
    ExprPtr first = stop_at_if ? parse_or() : parse_expression();
    if (!at_operator(",")) return first;
    ExprPtr tuple = make_expr(Expr::Kind::tuple, at);
    tuple->operands.push_back(std::move(first));
    while (skip_operator(",")) {
      if (current().type == Type::block_end || current().type == Type::variable_end) break;
      tuple->operands.push_back(stop_at_if ? parse_or() : parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (at_name("if")) {
      ExprPtr c = make_expr(Expr::Kind::conditional, current().position);
      advance();
      c->operands.push_back(parse_or());
      c->operands.push_back(std::move(e));
      c->operands.push_back(skip_name("else") ? parse_expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary_chain(Expr::Kind kind, std::string_view keyword, ExprPtr (Parser::*next)()) {
    ExprPtr left = (this->*next)();
    while (at_name(keyword)) {
      ExprPtr e = make_expr(kind, current().position);
      advance();
      e->operands.push_back(std::move(left));
      e->operands.push_back((this->*next)());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_or() { return binary_chain(Expr::Kind::logical_or, "or", &Parser::parse_and); }
  ExprPtr parse_and() { return binary_chain(Expr::Kind::logical_and, "and", &Parser::parse_not); }

  ExprPtr parse_not() {
    if (at_name("not")) {
      ExprPtr e = make_expr(Expr::Kind::logical_not, current().position);
      advance();
      e->operands.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePosition at = current().position;
    ExprPtr left = parse_math1();
    ExprPtr e;
    while (true) {
      std::string op;
      if (current().type == Type::operator_ &&
          (current().text == "==" || current().text == "!=" || current().text == "<" || current().text == "<=" ||
           current().text == ">" || current().text == ">=")) {
        op = advance().text;
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && peek().type == Type::name && peek().text == "in") {
        advance(), advance();
        op = "not in";
      } else {
        break;
      }
      if (!e) {
        e = make_expr(Expr::Kind::compare, at);
        e->operands.push_back(std::move(left));
      }
      e->ops.push_back(op);
      e->operands.push_back(parse_math1());
    }
    return e ? std::move(e) : std::move(left);
  }

  ExprPtr binary_operators(std::initializer_list<std::string_view> ops, ExprPtr (Parser::*next)()) {
    ExprPtr left = (this->*next)();
    while (true) {
      bool matched = false;
      for (const std::string_view op : ops) matched = matched || at_operator(op);
      if (!matched) return left;
      ExprPtr e = make_expr(Expr::Kind::binary, current().position);
      e->name = advance().text;
      e->operands.push_back(std::move(left));
      e->operands.push_back((this->*next)());
      left = std::move(e);
    }
  }

  ExprPtr parse_math1() { return binary_operators({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return binary_operators({"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() { return binary_operators({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return binary_operators({"**"}, &Parser::parse_unary_with_filters); }
  ExprPtr parse_unary_with_filters() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filters) {
    const DepthGuard guard(*this);
    const SourcePosition at = current().position;
    ExprPtr e;
    if (at_operator("-") || at_operator("+")) {
      e = make_expr(advance().text == "-" ? Expr::Kind::negate : Expr::Kind::unary_plus, at);
      e->operands.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filters ? parse_filters(std::move(e)) : std::move(e);
  }

  // Filters, tests and calls after a unary expression: x | f(a) is t(b) (c) ...
  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (at_operator("|")) {
        e = parse_filter(std::move(e));
      } else if (at_name("is")) {
        e = parse_test(std::move(e));
      } else if (at_operator("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter(ExprPtr subject) {
    skip_operator("|");
    const SourcePosition at = current().position;
    std::string name = expect_name("a filter name");
    while (skip_operator(".")) {
      name += '.';
      name += expect_name("a filter name");
    }
    if (!is_known_filter(name)) unsupported(at, str_cat("the filter '", name, "' is not supported"));
    ExprPtr e = make_expr(Expr::Kind::filter, at);
    e->name = std::move(name);
    e->operands.push_back(std::move(subject));
    if (at_operator("(")) parse_arguments(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const SourcePosition at = current().position;
    advance();  // is
    const bool negated = skip_name("not");
    std::string name = expect_name("a test name");
    // `none`, `true` and `false` are names here too (`x is none`).
    if (!is_known_test(name)) unsupported(at, str_cat("the test '", name, "' is not supported"));
    ExprPtr e = make_expr(Expr::Kind::test, at);
    e->name = std::move(name);
    e->operands.push_back(std::move(subject));
    if (at_operator("(")) {
      parse_arguments(*e);
    } else if ((current().type == Type::name && !at_name("else") && !at_name("or") && !at_name("and") &&
                !at_name("if") && !at_name("is") && !at_name("in") && !at_name("not")) ||
               current().type == Type::string || current().type == Type::integer || current().type == Type::floating ||
               at_operator("[") || at_operator("{")) {
      ExprPtr argument = parse_primary();
      e->operands.push_back(parse_postfix(std::move(argument)));  // `x is divisibleby 3`
    }
    if (!negated) return e;
    ExprPtr n = make_expr(Expr::Kind::logical_not, at);
    n->operands.push_back(std::move(e));
    return n;
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make_expr(Expr::Kind::call, callee->position);
    e->operands.push_back(std::move(callee));
    parse_arguments(*e);
    return e;
  }

  // (a, b, name=c) appended to e's operands and keywords.
  void parse_arguments(Expr& e) {
    expect_operator("(");
    bool first = true;
    while (!skip_operator(")")) {
      if (!first) expect_operator(",");
      first = false;
      if (skip_operator(")")) break;
      if (at_operator("*") || at_operator("**")) {  // f(*list), f(**dict)
        ExprPtr unpack = make_expr(at_operator("*") ? Expr::Kind::unpack_positional : Expr::Kind::unpack_keywords,
                                   current().position);
        advance();
        unpack->operands.push_back(parse_expression());
        e.operands.push_back(std::move(unpack));
        continue;
      }
      if (current().type == Type::name && peek().type == Type::operator_ && peek().text == "=") {
        std::string keyword = advance().text;
        advance();
        e.keywords.emplace_back(std::move(keyword), parse_expression());
      } else {
        if (!e.keywords.empty()) syntax_error("a positional argument follows a keyword argument");
        e.operands.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_operator(".")) {
        const SourcePosition at = current().position;
        advance();
        if (current().type == Type::integer) {  // x.0 is x[0]
          ExprPtr item = make_expr(Expr::Kind::item, at);
          item->operands.push_back(std::move(e));
          ExprPtr index = make_expr(Expr::Kind::literal, current().position);
          index->value = Value(advance().integer);
          item->operands.push_back(std::move(index));
          e = std::move(item);
          continue;
        }
        ExprPtr attribute = make_expr(Expr::Kind::attribute, at);
        attribute->name = expect_name("an attribute name");
        attribute->operands.push_back(std::move(e));
        e = std::move(attribute);
      } else if (at_operator("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_operator("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject) {
    const SourcePosition at = current().position;
    advance();  // [
    ExprPtr bounds[3];
    bool is_slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!at_operator(":") && !at_operator("]")) bounds[part] = parse_expression();
      if (part < 2 && skip_operator(":")) {
        is_slice = true;
        continue;
      }
      break;
    }
    if (at_operator(",")) unsupported(current().position, "tuple subscripts (x[a, b]) are not supported");
    expect_operator("]");
    ExprPtr e = make_expr(is_slice ? Expr::Kind::slice : Expr::Kind::item, at);
    e->operands.push_back(std::move(subject));
    if (!is_slice) {
      if (!bounds[0]) syntax_error("expected a subscript");
      e->operands.push_back(std::move(bounds[0]));
      return e;
    }
    for (ExprPtr& bound : bounds) e->operands.push_back(std::move(bound));
    return e;
  }

  ExprPtr literal(Value value, SourcePosition at) {
    ExprPtr e = make_expr(Expr::Kind::literal, at);
    e->value = std::move(value);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    const SourcePosition at = t.position;
    switch (t.type) {
      case Type::name: {
        const std::string name = advance().text;
        if (name == "true" || name == "True") return literal(Value(true), at);
        if (name == "false" || name == "False") return literal(Value(false), at);
        if (name == "none" || name == "None") return literal(Value::none(), at);
        ExprPtr e = make_expr(Expr::Kind::name, at);
        e->name = name;
        return e;
      }
      case Type::string: {
        std::string text = advance().text;
        while (current().type == Type::string) text += advance().text;  // adjacent literals concatenate
        return literal(Value(std::move(text)), at);
      }
      case Type::integer: return literal(Value(advance().integer), at);
      case Type::floating: return literal(Value(advance().floating), at);
      case Type::operator_:
        if (t.text == "(") return parse_parenthesized();
        if (t.text == "[") return parse_sequence(Expr::Kind::list, "]");
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    syntax_error("unexpected " + describe(t));
  }

  ExprPtr parse_parenthesized() {
    const SourcePosition at = current().position;
    advance();  // (
    if (skip_operator(")")) return make_expr(Expr::Kind::tuple, at);
    ExprPtr first = parse_expression();
    if (skip_operator(")")) return first;
    ExprPtr tuple = make_expr(Expr::Kind::tuple, at);
    tuple->operands.push_back(std::move(first));
    while (skip_operator(",")) {
      if (at_operator(")")) break;
      tuple->operands.push_back(parse_expression());
    }
    expect_operator(")");
    return tuple;
  }

  ExprPtr parse_sequence(Expr::Kind kind, std::string_view close) {
    ExprPtr e = make_expr(kind, current().position);
    advance();
    while (!skip_operator(close)) {
      if (!e->operands.empty()) expect_operator(",");
      if (skip_operator(close)) break;
      e->operands.push_back(parse_expression());
    }
    return e;
  }

  ExprPtr parse_dict() {
    ExprPtr e = make_expr(Expr::Kind::dict, current().position);
    advance();  // {
    while (!skip_operator("}")) {
      if (!e->operands.empty()) expect_operator(",");
      if (skip_operator("}")) break;
      e->operands.push_back(parse_expression());
      expect_operator(":");
      e->operands.push_back(parse_expression());
    }
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(tokenize(source)).parse(); }

}  // namespace microllm::jinja
