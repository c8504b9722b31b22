// A Jinja template's tokens and syntax tree: the lexer (jinja_lexer.cpp) turns the source into tokens, applying
// Jinja's whitespace control as transformers configures it (trim_blocks and lstrip_blocks on, `-` and `+`
// markers); the parser (jinja_parser.cpp) builds the tree; the evaluator (jinja_eval.cpp) renders it.
// Internal header of the tokenizer layer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace microllm::jinja {

// A place in the template source (both 1-based; the column counts characters).
struct SourcePosition {
  int line = 1;
  int column = 1;
};

struct Token {
  enum class Type {
    text,            // template data between tags, whitespace control applied
    variable_begin,  // {{
    variable_end,    // }}
    block_begin,     // {%
    block_end,       // %}
    name,
    integer,
    floating,
    string,     // a literal, escapes decoded
    operator_,  // + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } . : | , ;
    end,
  };
  Type type;
  std::string text;  // the text, name, operator or decoded string
  int64_t integer = 0;
  double floating = 0;
  SourcePosition position;
};

// Tokens of a template source (newlines normalized, one trailing newline dropped, as Jinja does).
// Throws ParseError naming the line and column of a malformed tag or literal.
std::vector<Token> tokenize(std::string_view source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,            // value
    name,               // name
    list,               // operands
    tuple,              // operands (Python tuples behave as lists here)
    dict,               // operands: key, value, key, value, ...
    attribute,          // operands[0].name
    item,               // operands[0][operands[1]]
    slice,              // operands[0][operands[1]:operands[2]:operands[3]], absent bounds null
    call,               // operands[0](operands[1..], keywords)
    filter,             // operands[0] | name(operands[1..], keywords)
    test,               // operands[0] is name(operands[1..], keywords)
    negate,             // -operands[0]
    unary_plus,         // +operands[0]
    logical_not,        // not operands[0]
    binary,             // operands[0] name operands[1]: + - * / // % ** ~
    compare,            // operands[0] ops[0] operands[1] ops[1] operands[2] ...: == != < <= > >= in, not in
    logical_and,        // operands[0] and operands[1]
    logical_or,         // operands[0] or operands[1]
    conditional,        // operands[1] if operands[0] else operands[2] (null: undefined)
    unpack_positional,  // *operands[0] in a call's arguments
    unpack_keywords,    // **operands[0] in a call's arguments
  };
  Kind kind;
  SourcePosition position;
  Value value;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct MacroParameter {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when not given, as Jinja passes it)
};

struct Node {
  enum class Kind {
    text,          // text
    output,        // {{ expr }}
    if_,           // branches: (condition, body) ..., a final else with a null condition
    for_,          // for targets in expr [if condition]: body [else: else_body]
    set,           // set targets = expr, or set targets[0].attribute = expr (a namespace)
    set_block,     // set targets[0] [| filters on expr]: body (the rendered body, filtered)
    macro,         // macro name(parameters): body
    call_block,    // call[(parameters)] expr: body (the body is `caller`)
    filter_block,  // filter expr: body (expr is the filter chain over a placeholder)
    break_,
    continue_,
    generation,  // {% generation %} body {% endgeneration %}: transformers' assistant tracking; renders body
  };
  Kind kind;
  SourcePosition position;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attribute;
  std::string name;
  std::vector<MacroParameter> parameters;
  Body body, else_body;
};

// Builds the tree; throws ParseError for malformed syntax and NotSupportedError for Jinja constructs the
// engine does not implement (each naming the line, column and construct).
Body parse_template(std::string_view source);

// Every filter and test the evaluator implements (jinja_builtins.cpp), for the parser's checks.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace microllm::jinja
