#pragma once
// The Jinja component's internals: tokens (lexer.cpp), the syntax tree (parser.cpp) that the evaluator
// (eval.cpp) walks. Not used outside core/src/jinja.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/jinja.hpp"

namespace ax::jinja::detail {

struct Pos {
  int line = 1, column = 1;
};

enum class Tok {
  text,        // template data between tags (whitespace control already applied)
  var_begin,   // {{
  var_end,     // }}
  block_begin, // {%
  block_end,   // %}
  name,
  string,      // value: the unescaped string
  integer,
  floating,
  op,          // value: the operator or punctuation, e.g. "==", "(", "|"
  eof,
};

struct Token {
  Tok kind;
  std::string value;
  Pos pos;
};

// Splits a template into tokens, applying Jinja2's whitespace rules as transformers configures them:
// trim_blocks (the first newline after a block or comment tag is removed), lstrip_blocks (spaces and tabs from
// the start of a line to a block or comment tag are removed), and the explicit - / + modifiers.
std::vector<Token> lex(std::string_view source, const std::string& name);

struct Expr;
using ExprP = std::unique_ptr<Expr>;

enum class ExprKind {
  literal,   // value
  name,      // str
  list,      // items
  tuple,     // items
  dict,      // items: key, value, key, value, ...
  getattr,   // a.str
  getitem,   // a[items[0]]
  slice,     // a[items[0]:items[1]:items[2]] (each may be null)
  call,      // a(items..., kwnames[i]=kwargs[i])
  filter,    // a | str(items..., kw...)
  test,      // a is [not] str(items...)
  unary,     // str in {"-", "+", "not"}; a
  binary,    // a str b: + - * / // % ** ~ and or == != < > <= >= in "not in"
  cond,      // items[0] if items[1] else items[2] (items[2] may be null)
};

struct Expr {
  ExprKind kind;
  Pos pos;
  std::string str;
  Json value;
  bool negated = false;
  ExprP a, b;
  std::vector<ExprP> items;
  std::vector<std::string> kwnames;
  std::vector<ExprP> kwargs;
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

enum class StmtKind {
  text,        // str
  output,      // {{ expr }}
  if_,         // conds[i] -> bodies[i]; else_body
  for_,        // targets in expr [if cond]: body; else_body
  set,         // targets (one name, several names, or ns.attr in attr) = expr; or a {% set x %} block: body
  macro,       // name(params = defaults) body
  break_,
  continue_,
  generation,  // body
};

struct Stmt {
  StmtKind kind;
  Pos pos;
  std::string str;                 // text; macro name; set: namespace variable of ns.attr
  std::string attr;                // set: attribute of ns.attr
  std::vector<std::string> targets;
  ExprP expr, cond;
  std::vector<ExprP> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprP> defaults;     // one per param, null where none
};

struct Program {
  std::string name;
  Body body;
  bool has_generation = false;
};

// Parses tokens into a Program. Throws Error naming the line and column.
std::unique_ptr<Program> parse(std::vector<Token> tokens, std::string name);

// Limits on nesting while parsing (statements and expressions): hostile input ends in an Error, not a stack overflow.
inline constexpr int kMaxNesting = 256;

}  // namespace ax::jinja::detail
