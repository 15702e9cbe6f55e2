// Recursive-descent parser for the Jinja subset (docs/jinja.md), with jinja2.parser's precedence:
// conditional < or < and < not < comparisons (in, not in) < + - < ~ < * / // % < ** < unary - + < postfix
// (attribute, subscript, call, then filters and tests).
#include <cstdlib>

#include "jinja/ast.hpp"

namespace ax::jinja::detail {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, std::string name) : t_(std::move(toks)), name_(std::move(name)) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    prog->name = name_;
    std::string end;
    prog->body = body({}, end);
    prog->has_generation = has_generation_;
    return prog;
  }

 private:
  const Token& peek(std::size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op, std::size_t k = 0) const { return peek(k).kind == Tok::op && peek(k).value == op; }
  bool is_name(const char* n, std::size_t k = 0) const { return peek(k).kind == Tok::name && peek(k).value == n; }
  [[noreturn]] void fail(const Pos& p, const std::string& msg) const { throw Error(name_, p.line, p.column, msg); }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Tok::eof: return "end of template";
      case Tok::block_end: return "'%}'";
      case Tok::var_end: return "'}}'";
      case Tok::text: return "text";
      default: return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek().pos, std::string("expected '") + op + "', got " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().kind != Tok::name) fail(peek().pos, "expected a name, got " + describe(peek()));
    return next().value;
  }
  void expect_block_end() {
    if (peek().kind != Tok::block_end) fail(peek().pos, "expected '%}', got " + describe(peek()));
    next();
  }
  struct Depth {
    Parser& p;
    Depth(Parser& p_, const Pos& pos) : p(p_) {
      if (++p.depth_ > kMaxNesting) p.fail(pos, "template nests too deeply");
    }
    ~Depth() { --p.depth_; }
  };

  // Statements until one of `ends` (block names) at this level; `end` gets which one ended it.
  Body body(const std::vector<std::string>& ends, std::string& end) {
    Body out;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::eof) {
        if (!ends.empty()) fail(t.pos, "unexpected end of template: expected {% " + ends.front() + " %}");
        return out;
      }
      if (t.kind == Tok::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::text;
        s->pos = t.pos;
        s->str = next().value;
        out.push_back(std::move(s));
      } else if (t.kind == Tok::var_begin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::output;
        s->pos = next().pos;
        s->expr = expr();
        if (peek().kind != Tok::var_end) fail(peek().pos, "expected '}}', got " + describe(peek()));
        next();
        out.push_back(std::move(s));
      } else if (t.kind == Tok::block_begin) {
        next();
        const Token& kw = peek();
        if (kw.kind != Tok::name) fail(kw.pos, "expected a tag name, got " + describe(kw));
        for (const auto& e : ends)
          if (kw.value == e) {
            end = next().value;
            return out;
          }
        out.push_back(statement());
      } else {
        fail(t.pos, "unexpected " + describe(t));
      }
    }
  }

  StmtP statement() {
    const Token& kw = next();
    Depth d(*this, kw.pos);
    auto s = std::make_unique<Stmt>();
    s->pos = kw.pos;
    const std::string& k = kw.value;
    if (k == "if") {
      s->kind = StmtKind::if_;
      s->conds.push_back(expr());
      expect_block_end();
      while (true) {
        std::string end;
        Body b = body({"elif", "else", "endif"}, end);
        s->bodies.push_back(std::move(b));
        if (end == "elif") {
          s->conds.push_back(expr());
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->else_body = body({"endif"}, end);
          break;
        } else {
          break;
        }
      }
      expect_block_end();
    } else if (k == "for") {
      s->kind = StmtKind::for_;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail(peek().pos, "expected 'in' in a for tag, got " + describe(peek()));
      next();
      s->expr = expr(/*allow_cond=*/false);
      if (is_name("if")) {
        next();
        s->cond = expr(false);
      }
      if (is_name("recursive")) fail(peek().pos, "recursive for loops are not supported");
      expect_block_end();
      std::string end;
      s->body = body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        s->else_body = body({"endfor"}, end);
      }
      expect_block_end();
    } else if (k == "set") {
      s->kind = StmtKind::set;
      std::string first = expect_name();
      if (is_op(".")) {
        next();
        s->str = first;
        s->attr = expect_name();
      } else {
        s->targets.push_back(first);
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        next();
        s->expr = expr();
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) fail(peek().pos, "a {% set %} block assigns one name");
        expect_block_end();
        std::string end;
        s->body = body({"endset"}, end);
        expect_block_end();
      }
    } else if (k == "macro") {
      s->kind = StmtKind::macro;
      s->str = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        s->params.push_back(expect_name());
        if (is_op("=")) {
          next();
          s->defaults.push_back(expr());
        } else {
          s->defaults.push_back(nullptr);
        }
        if (!is_op(",")) break;
        next();
      }
      expect_op(")");
      expect_block_end();
      std::string end;
      s->body = body({"endmacro"}, end);
      expect_block_end();
    } else if (k == "break" || k == "continue") {
      s->kind = k == "break" ? StmtKind::break_ : StmtKind::continue_;
      expect_block_end();
    } else if (k == "generation") {
      s->kind = StmtKind::generation;
      has_generation_ = true;
      expect_block_end();
      std::string end;
      s->body = body({"endgeneration"}, end);
      expect_block_end();
    } else {
      fail(kw.pos, "unknown or unsupported tag '" + k + "'");
    }
    return s;
  }

  ExprP make(ExprKind kind, const Pos& pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  ExprP binary(const std::string& op, ExprP a, ExprP b, const Pos& pos) {
    auto e = make(ExprKind::binary, pos);
    e->str = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprP expr(bool allow_cond = true) {
    Depth d(*this, peek().pos);
    ExprP e = or_expr();
    while (allow_cond && is_name("if")) {
      Pos p = next().pos;
      auto c = make(ExprKind::cond, p);
      c->items.push_back(std::move(e));
      c->items.push_back(or_expr());
      if (is_name("else")) {
        next();
        c->items.push_back(expr());
      } else {
        c->items.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      Pos p = next().pos;
      e = binary("or", std::move(e), and_expr(), p);
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      Pos p = next().pos;
      e = binary("and", std::move(e), not_expr(), p);
    }
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      Depth d(*this, peek().pos);
      Pos p = next().pos;
      auto e = make(ExprKind::unary, p);
      e->str = "not";
      e->a = not_expr();
      return e;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    while (true) {
      const Token& t = peek();
      std::string op;
      if (t.kind == Tok::op && (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == ">" ||
                                t.value == "<=" || t.value == ">="))
        op = t.value;
      else if (is_name("in"))
        op = "in";
      else if (is_name("not") && is_name("in", 1))
        op = "not in";
      else
        return e;
      Pos p = next().pos;
      if (op == "not in") next();
      // a < b < c is (a < b) and (b < c) in Jinja; templates do not chain, so chains are refused, not misread.
      ExprP rhs = math1();
      e = binary(op, std::move(e), std::move(rhs), p);
      const Token& n = peek();
      if ((n.kind == Tok::op && (n.value == "==" || n.value == "!=" || n.value == "<" || n.value == ">" ||
                                 n.value == "<=" || n.value == ">=")))
        fail(n.pos, "chained comparisons are not supported: add parentheses");
    }
  }
  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.value, std::move(e), concat(), t.pos);
    }
    return e;
  }
  ExprP concat() {
    ExprP e = math2();
    while (is_op("~")) {
      Pos p = next().pos;
      e = binary("~", std::move(e), math2(), p);
    }
    return e;
  }
  ExprP math2() {
    ExprP e = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.value, std::move(e), pow(), t.pos);
    }
    return e;
  }
  ExprP pow() {
    ExprP e = unary(true);
    while (is_op("**")) {
      Pos p = next().pos;
      e = binary("**", std::move(e), unary(true), p);
    }
    return e;
  }
  ExprP unary(bool with_filter) {
    Depth d(*this, peek().pos);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(ExprKind::unary, t.pos);
      e->str = t.value;
      e->a = unary(false);
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprP primary() {
    const Token& t = next();
    switch (t.kind) {
      case Tok::string: {
        auto e = make(ExprKind::literal, t.pos);
        std::string s = t.value;
        while (peek().kind == Tok::string) s += next().value;  // adjacent literals concatenate, as in Python
        e->value = s;
        return e;
      }
      case Tok::integer: {
        auto e = make(ExprKind::literal, t.pos);
        try {
          e->value = std::stoll(t.value);
        } catch (const std::exception&) {
          fail(t.pos, "integer literal out of range");
        }
        return e;
      }
      case Tok::floating: {
        auto e = make(ExprKind::literal, t.pos);
        e->value = std::strtod(t.value.c_str(), nullptr);  // 1e999 is inf, as Python's float literal
        return e;
      }
      case Tok::name: {
        auto e = make(ExprKind::literal, t.pos);
        if (t.value == "true" || t.value == "True") e->value = true;
        else if (t.value == "false" || t.value == "False") e->value = false;
        else if (t.value == "none" || t.value == "None") e->value = nullptr;
        else {
          e->kind = ExprKind::name;
          e->str = t.value;
        }
        return e;
      }
      case Tok::op:
        if (t.value == "(") {
          if (is_op(")")) {
            next();
            return make(ExprKind::tuple, t.pos);
          }
          ExprP first = expr();
          if (is_op(")")) {
            next();
            return first;
          }
          auto tup = make(ExprKind::tuple, t.pos);
          tup->items.push_back(std::move(first));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            tup->items.push_back(expr());
          }
          expect_op(")");
          return tup;
        }
        if (t.value == "[") {
          auto l = make(ExprKind::list, t.pos);
          while (!is_op("]")) {
            l->items.push_back(expr());
            if (!is_op(",")) break;
            next();
          }
          expect_op("]");
          return l;
        }
        if (t.value == "{") {
          auto dct = make(ExprKind::dict, t.pos);
          while (!is_op("}")) {
            dct->items.push_back(expr());
            expect_op(":");
            dct->items.push_back(expr());
            if (!is_op(",")) break;
            next();
          }
          expect_op("}");
          return dct;
        }
        break;
      default: break;
    }
    fail(t.pos, "unexpected " + describe(t) + " in an expression");
  }

  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tok::name && is_op("=", 1)) {
        e.kwnames.push_back(next().value);
        next();
        e.kwargs.push_back(expr());
      } else {
        if (!e.kwnames.empty()) fail(peek().pos, "positional argument after a keyword argument");
        e.items.push_back(expr());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprP postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        Pos p = next().pos;
        auto g = make(ExprKind::getattr, p);
        if (peek().kind == Tok::integer) {  // foo.0 is foo[0] in Jinja
          g->kind = ExprKind::getitem;
          auto idx = make(ExprKind::literal, peek().pos);
          const Token& n = next();
          try {
            idx->value = std::stoll(n.value);
          } catch (const std::exception&) {
            fail(n.pos, "integer literal out of range");
          }
          g->items.push_back(std::move(idx));
        } else {
          g->str = expect_name();
        }
        g->a = std::move(e);
        e = std::move(g);
      } else if (is_op("[")) {
        Pos p = next().pos;
        ExprP parts[3];
        int n = 0;
        bool is_slice = false;
        while (true) {
          if (!is_op(":") && !is_op("]")) parts[n] = expr();
          if (is_op(":")) {
            next();
            is_slice = true;
            if (++n > 2) fail(peek().pos, "too many ':' in a slice");
            continue;
          }
          break;
        }
        expect_op("]");
        auto g = make(is_slice ? ExprKind::slice : ExprKind::getitem, p);
        if (!is_slice && !parts[0]) fail(p, "empty subscript");
        g->a = std::move(e);
        for (int k = 0; k < (is_slice ? 3 : 1); ++k) g->items.push_back(std::move(parts[k]));
        e = std::move(g);
      } else if (is_op("(")) {
        auto c = make(ExprKind::call, peek().pos);
        c->a = std::move(e);
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        Pos p = next().pos;
        auto f = make(ExprKind::filter, p);
        f->str = expect_name();
        if (is_op("(")) call_args(*f);
        f->a = std::move(e);
        e = std::move(f);
      } else if (is_name("is")) {
        Pos p = next().pos;
        auto t = make(ExprKind::test, p);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->str = expect_name();
        if (is_op("(")) {
          call_args(*t);
        } else {
          // One bare argument, as Jinja allows: `x is divisibleby 3`, `x is sameas none`.
          const Token& n = peek();
          bool starts = n.kind == Tok::string || n.kind == Tok::integer || n.kind == Tok::floating ||
                        (n.kind == Tok::name && n.value != "else" && n.value != "or" && n.value != "and" &&
                         n.value != "if" && n.value != "in" && n.value != "not" && n.value != "is") ||
                        (n.kind == Tok::op && (n.value == "[" || n.value == "{"));
          if (starts) t->items.push_back(postfix(primary()));
        }
        t->a = std::move(e);
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  std::size_t i_ = 0;
  std::string name_;
  int depth_ = 0;
  bool has_generation_ = false;
};

}  // namespace

std::unique_ptr<Program> parse(std::vector<Token> tokens, std::string name) {
  return Parser(std::move(tokens), std::move(name)).run();
}

}  // namespace ax::jinja::detail
