// Walks a parsed template. Scoping follows Jinja2: a for loop's body and a macro's body are their own scopes
// ({% set %} inside does not leak out), `if` is not a scope, namespace() attributes are the way out of a loop.
#include <cmath>

#include "jinja/eval.hpp"

namespace ax::jinja::detail {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  Frame* parent = nullptr;

  Value* find(const std::string& name) {
    for (Frame* f = this; f; f = f->parent)
      for (auto& [k, v] : f->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

class Renderer {
 public:
  Renderer(const Program& prog, const RenderOptions& opt) : prog_(prog), opt_(opt) {}

  RenderResult run(const Json& context) {
    Frame globals;
    for (auto& [k, v] : global_functions(opt_)) globals.set(k, std::move(v));
    Frame ctx{{}, &globals};
    if (!context.is_object()) throw Error(prog_.name, 1, 1, "render context must be a JSON object");
    auto shared = std::make_shared<const Json>(context);
    for (const auto& [k, v] : shared->items()) ctx.set(k, Value(std::shared_ptr<const Json>(shared, &v)));
    Frame root{{}, &ctx};
    RenderResult res;
    out_ = &res.text;
    spans_ = &res.generation;
    exec_body(prog_.body, root);
    return res;
  }

 private:
  enum class Flow { normal, brk, cont };

  [[noreturn]] void fail(const Pos& p, const std::string& msg) const {
    throw Error(prog_.name, p.line, p.column, msg);
  }
  void step(const Pos& p) {
    if (++steps_ > opt_.max_steps) fail(p, "template exceeded its evaluation budget (" + std::to_string(opt_.max_steps) + " steps)");
  }
  // Work proportional to a value's size (a built list or string) counts against the budget too, so a loop over
  // range() or a string doubling in a loop stops as surely as a deep loop does.
  Value charge(Value v, const Pos& p) {
    if (v.is_data()) {
      const Json& j = v.json();
      std::size_t n = j.is_string() ? j.get_ref<const std::string&>().size() / 64 : (j.is_array() || j.is_object()) ? j.size() : 0;
      steps_ += n;
      step(p);
    }
    return v;
  }
  void emit(const std::string& s, const Pos& p) {
    if (out_->size() + s.size() > opt_.max_output_bytes) fail(p, "template output exceeds its budget");
    *out_ += s;
  }

  Flow exec_body(const Body& body, Frame& f) {
    for (const auto& s : body) {
      Flow fl = exec(*s, f);
      if (fl != Flow::normal) return fl;
    }
    return Flow::normal;
  }

  // Renders `body` into a fresh buffer (macro calls, set blocks): generation spans inside are not tracked,
  // their offsets would be relative to that buffer (transformers has the same limit).
  std::string capture(const Body& body, Frame& f) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    ++capturing_;
    try {
      exec_body(body, f);
    } catch (...) {
      out_ = saved;
      --capturing_;
      throw;
    }
    out_ = saved;
    --capturing_;
    return buf;
  }

  Flow exec(const Stmt& s, Frame& f) {
    step(s.pos);
    switch (s.kind) {
      case StmtKind::text: emit(s.str, s.pos); return Flow::normal;
      case StmtKind::output: emit(value_str(eval(*s.expr, f)), s.pos); return Flow::normal;
      case StmtKind::if_:
        for (std::size_t i = 0; i < s.conds.size(); ++i)
          if (truthy(eval(*s.conds[i], f))) return exec_body(s.bodies[i], f);
        return exec_body(s.else_body, f);
      case StmtKind::for_: return exec_for(s, f);
      case StmtKind::set: exec_set(s, f); return Flow::normal;
      case StmtKind::macro: f.set(s.str, make_macro(s, f)); return Flow::normal;
      case StmtKind::break_:
        if (loop_depth_ == 0) fail(s.pos, "break outside a for loop");
        return Flow::brk;
      case StmtKind::continue_:
        if (loop_depth_ == 0) fail(s.pos, "continue outside a for loop");
        return Flow::cont;
      case StmtKind::generation: {
        // transformers' AssistantTracker renders the body as a call block (its own scope) and records the
        // character span it produced.
        Frame inner{{}, &f};
        std::size_t begin = out_->size();
        Flow fl = exec_body(s.body, inner);
        if (capturing_ == 0) spans_->emplace_back(begin, out_->size());
        return fl;
      }
    }
    return Flow::normal;
  }

  Flow exec_for(const Stmt& s, Frame& f) {
    std::vector<Value> items;
    {
      Value seq = eval(*s.expr, f);
      if (seq.is_none() || (seq.is_data() && (seq.json().is_number() || seq.json().is_boolean())) ||
          seq.kind() == Value::Kind::ns || seq.kind() == Value::Kind::callable)
        fail(s.expr->pos, "'" + type_name(seq) + "' object is not iterable");
      items = iterate(seq);
    }
    auto bind = [&](Frame& fr, const Value& item) {
      if (s.targets.size() == 1) {
        fr.set(s.targets[0], item);
        return;
      }
      if (!item.is_data() || !item.json().is_array() || item.json().size() != s.targets.size())
        fail(s.pos, "cannot unpack " + type_name(item) + " into " + std::to_string(s.targets.size()) + " loop variables");
      for (std::size_t k = 0; k < s.targets.size(); ++k) fr.set(s.targets[k], item.alias(item.json()[k]));
    };
    if (s.cond) {  // `for x in xs if cond`: filtered first, so loop.index/length count what remains
      std::vector<Value> kept;
      for (const auto& it : items) {
        step(s.pos);
        Frame probe{{}, &f};
        bind(probe, it);
        if (truthy(eval(*s.cond, probe))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame inner{{}, &f};
      exec_body(s.else_body, inner);
      return Flow::normal;
    }
    ++loop_depth_;
    const std::size_t n = items.size();
    for (std::size_t i = 0; i < n; ++i) {
      try {
        step(s.pos);
      } catch (...) {
        --loop_depth_;
        throw;
      }
      Frame inner{{}, &f};
      bind(inner, items[i]);
      Json loop = {{"index0", i}, {"index", i + 1}, {"revindex", n - i}, {"revindex0", n - i - 1},
                   {"first", i == 0}, {"last", i + 1 == n}, {"length", n}, {"depth", 1}, {"depth0", 0}};
      if (i > 0 && items[i - 1].is_data()) loop["previtem"] = items[i - 1].json();
      if (i + 1 < n && items[i + 1].is_data()) loop["nextitem"] = items[i + 1].json();
      inner.set("loop", Value(std::move(loop)));
      Flow fl;
      try {
        fl = exec_body(s.body, inner);
      } catch (...) {
        --loop_depth_;
        throw;
      }
      if (fl == Flow::brk) break;
    }
    --loop_depth_;
    return Flow::normal;
  }

  void exec_set(const Stmt& s, Frame& f) {
    if (!s.attr.empty()) {
      Value* ns = f.find(s.str);
      if (!ns || ns->kind() != Value::Kind::ns)
        fail(s.pos, "cannot assign attribute on non-namespace object '" + s.str + "'");
      Value v = eval(*s.expr, f);
      // Only data in a namespace: a macro or namespace stored there could outlive the scope it refers to.
      if (!v.is_data() && !v.is_undefined()) fail(s.pos, "a namespace attribute holds data, not a " + type_name(v));
      if (Value* slot = ns->ns()->find(s.attr)) *slot = std::move(v);
      else ns->ns()->attrs.emplace_back(s.attr, std::move(v));
      return;
    }
    if (!s.expr) {
      Frame inner{{}, &f};
      f.set(s.targets[0], Value(Json(capture(s.body, inner))));
      return;
    }
    Value v = eval(*s.expr, f);
    if (s.targets.size() == 1) {
      f.set(s.targets[0], std::move(v));
      return;
    }
    if (!v.is_data() || !v.json().is_array() || v.json().size() != s.targets.size())
      fail(s.pos, "cannot unpack " + type_name(v) + " into " + std::to_string(s.targets.size()) + " names");
    for (std::size_t k = 0; k < s.targets.size(); ++k) f.set(s.targets[k], v.alias(v.json()[k]));
  }

  Value make_macro(const Stmt& s, Frame& defining) {
    const Stmt* m = &s;
    Frame* parent = &defining;
    return Value::callable(s.str, [this, m, parent](Args& args) -> Value {
      if (args.pos.size() > m->params.size())
        throw EvalFail{"macro '" + m->str + "' takes " + std::to_string(m->params.size()) + " arguments, got " +
                       std::to_string(args.pos.size())};
      if (++call_depth_ > opt_.max_call_depth) {
        --call_depth_;
        throw EvalFail{"macro calls nest deeper than " + std::to_string(opt_.max_call_depth)};
      }
      struct Guard {
        int& d;
        ~Guard() { --d; }
      } guard{call_depth_};
      Frame inner{{}, parent};
      for (const auto& [k, v] : args.kw) {
        bool known = false;
        for (const auto& p : m->params) known |= p == k;
        if (!known) throw EvalFail{"macro '" + m->str + "' has no argument '" + k + "'"};
      }
      for (std::size_t i = 0; i < m->params.size(); ++i) {
        const std::string& p = m->params[i];
        if (i < args.pos.size()) {
          inner.set(p, args.pos[i]);
          continue;
        }
        bool given = false;
        for (const auto& [k, v] : args.kw)
          if (k == p) {
            inner.set(p, v);
            given = true;
          }
        if (!given) inner.set(p, m->defaults[i] ? eval(*m->defaults[i], inner) : Value::undefined(p));
      }
      int saved_loops = loop_depth_;
      loop_depth_ = 0;  // break/continue do not cross a macro boundary
      std::string out;
      try {
        out = capture(m->body, inner);
      } catch (...) {
        loop_depth_ = saved_loops;
        throw;
      }
      loop_depth_ = saved_loops;
      return Value(Json(std::move(out)));
    });
  }

 public:
  Value eval(const Expr& e, Frame& f) {
    step(e.pos);
    try {
      return eval_inner(e, f);
    } catch (const EvalFail& x) {
      fail(e.pos, x.message);
    } catch (const EvalRaise& x) {
      throw Error(prog_.name, e.pos.line, e.pos.column, x.message, /*raised=*/true);
    } catch (const nlohmann::json::exception& x) {
      fail(e.pos, x.what());
    } catch (const std::runtime_error& x) {
      if (dynamic_cast<const Error*>(&x)) throw;
      fail(e.pos, x.what());
    }
  }

 private:
  Args eval_args(const Expr& e, Frame& f) {
    Args a;
    a.renderer = this;
    for (const auto& x : e.items) a.pos.push_back(eval(*x, f));
    for (std::size_t i = 0; i < e.kwnames.size(); ++i) a.kw.emplace_back(e.kwnames[i], eval(*e.kwargs[i], f));
    return a;
  }

  Value eval_inner(const Expr& e, Frame& f) {
    switch (e.kind) {
      case ExprKind::literal: return Value(e.value);
      case ExprKind::name: {
        if (Value* v = f.find(e.str)) return *v;
        return Value::undefined(e.str);
      }
      case ExprKind::list:
      case ExprKind::tuple: {
        Json arr = Json::array();
        for (const auto& x : e.items) arr.push_back(eval(*x, f).to_json());
        return Value(std::move(arr));
      }
      case ExprKind::dict: {
        Json obj = Json::object();
        for (std::size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value k = eval(*e.items[i], f);
          if (!k.is_string()) throw EvalFail{"dict keys must be strings here, got " + type_name(k)};
          obj[k.str()] = eval(*e.items[i + 1], f).to_json();
        }
        return Value(std::move(obj));
      }
      case ExprKind::getattr: return getattr(eval(*e.a, f), e.str);
      case ExprKind::getitem: return getitem(eval(*e.a, f), eval(*e.items[0], f));
      case ExprKind::slice: return slice(e, f);
      case ExprKind::call: {
        Value callee = eval(*e.a, f);
        Args a = eval_args(e, f);
        if (callee.kind() != Value::Kind::callable) {
          std::string what = e.a->kind == ExprKind::name ? "'" + e.a->str + "'" : "'" + type_name(callee) + "' object";
          throw EvalFail{what + (callee.is_undefined() ? " is undefined" : " is not callable")};
        }
        return charge(callee.fn()(a), e.pos);
      }
      case ExprKind::filter: {
        Value v = eval(*e.a, f);
        Args a = eval_args(e, f);
        return charge(apply_filter(e.str, v, a), e.pos);
      }
      case ExprKind::test: {
        Value v = eval(*e.a, f);
        Args a = eval_args(e, f);
        return Value(Json(apply_test(e.str, v, a) != e.negated));
      }
      case ExprKind::unary: {
        Value v = eval(*e.a, f);
        if (e.str == "not") return Value(Json(!truthy(v)));
        if (!v.is_data() || !v.json().is_number())
          throw EvalFail{"bad operand type for unary " + e.str + ": '" + type_name(v) + "'"};
        if (e.str == "+") return v;
        if (v.json().is_number_float()) return Value(Json(-v.json().get<double>()));
        return Value(Json(-v.json().get<std::int64_t>()));
      }
      case ExprKind::binary: return charge(binary(e, f), e.pos);
      case ExprKind::cond:
        if (truthy(eval(*e.items[1], f))) return eval(*e.items[0], f);
        return e.items[2] ? eval(*e.items[2], f) : Value::undefined("conditional expression");
    }
    throw EvalFail{"unknown expression"};
  }

  Value slice(const Expr& e, Frame& f) {
    Value obj = eval(*e.a, f);
    std::int64_t parts[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.items[k]) continue;
      Value v = eval(*e.items[k], f);
      if (v.is_none()) continue;
      if (!v.is_data() || !v.json().is_number_integer())
        throw EvalFail{"slice indices must be integers or None"};
      parts[k] = v.json().get<std::int64_t>();
      given[k] = true;
    }
    if (parts[2] == 0) throw EvalFail{"slice step cannot be zero"};
    bool is_str = obj.is_string();
    if (!obj.is_data() || !(is_str || obj.json().is_array())) throw EvalFail{"'" + type_name(obj) + "' object is not subscriptable"};
    std::vector<std::uint32_t> cps;
    if (is_str) cps = decode_utf8(obj.str());
    auto n = static_cast<std::int64_t>(is_str ? cps.size() : obj.json().size());
    // Python's slice.indices().
    std::int64_t step = parts[2];
    auto norm = [&](std::int64_t v, bool g, std::int64_t dflt) {
      if (!g) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<std::int64_t>(v, 0, n);
      return std::clamp<std::int64_t>(v, -1, n - 1);
    };
    std::int64_t start = norm(parts[0], given[0], step > 0 ? 0 : n - 1);
    std::int64_t stop = norm(parts[1], given[1], step > 0 ? n : -1);
    std::vector<std::int64_t> idx;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (is_str) {
      std::string out;
      for (auto i : idx) append_utf8(out, cps[static_cast<std::size_t>(i)]);
      return Value(Json(std::move(out)));
    }
    Json arr = Json::array();
    for (auto i : idx) arr.push_back(obj.json()[static_cast<std::size_t>(i)]);
    return Value(std::move(arr));
  }

  Value binary(const Expr& e, Frame& f) {
    const std::string& op = e.str;
    if (op == "and") {
      Value a = eval(*e.a, f);
      return truthy(a) ? eval(*e.b, f) : a;
    }
    if (op == "or") {
      Value a = eval(*e.a, f);
      return truthy(a) ? a : eval(*e.b, f);
    }
    Value a = eval(*e.a, f), b = eval(*e.b, f);
    if (op == "~") {
      std::string s = value_str(a) + value_str(b);
      if (s.size() > opt_.max_output_bytes) throw EvalFail{"string exceeds the output budget"};
      return Value(Json(std::move(s)));
    }
    if (op == "==") return Value(Json(py_equal(a, b)));
    if (op == "!=") return Value(Json(!py_equal(a, b)));
    if (op == "<") return Value(Json(py_compare(a, b) < 0));
    if (op == ">") return Value(Json(py_compare(a, b) > 0));
    if (op == "<=") return Value(Json(py_compare(a, b) <= 0));
    if (op == ">=") return Value(Json(py_compare(a, b) >= 0));
    if (op == "in") return Value(Json(py_contains(b, a)));
    if (op == "not in") return Value(Json(!py_contains(b, a)));
    return arithmetic(op, a, b);
  }

  Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    auto bad = [&]() -> EvalFail {
      if (a.is_undefined()) return {"'" + a.name() + "' is undefined"};
      if (b.is_undefined()) return {"'" + b.name() + "' is undefined"};
      return {"unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'"};
    };
    if (!a.is_data() || !b.is_data()) throw bad();
    const Json &x = a.json(), &y = b.json();
    if (op == "+") {
      if (x.is_string() && y.is_string()) {
        if (x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size() > opt_.max_output_bytes)
          throw EvalFail{"string exceeds the output budget"};
        return Value(Json(x.get_ref<const std::string&>() + y.get_ref<const std::string&>()));
      }
      if (x.is_array() && y.is_array()) {
        Json r = x;
        for (const auto& v : y) r.push_back(v);
        return Value(std::move(r));
      }
    }
    if (op == "*" && ((x.is_string() || x.is_array()) && y.is_number_integer())) {
      std::int64_t n = std::max<std::int64_t>(0, y.get<std::int64_t>());
      std::size_t unit = x.is_string() ? x.get_ref<const std::string&>().size() : x.size();
      if (unit && static_cast<std::uint64_t>(n) > opt_.max_output_bytes / unit) throw EvalFail{"repetition exceeds the output budget"};
      if (x.is_string()) {
        std::string r;
        for (std::int64_t i = 0; i < n; ++i) r += x.get_ref<const std::string&>();
        return Value(Json(std::move(r)));
      }
      Json r = Json::array();
      for (std::int64_t i = 0; i < n; ++i)
        for (const auto& v : x) r.push_back(v);
      return Value(std::move(r));
    }
    auto numeric = [](const Json& j) { return j.is_number() || j.is_boolean(); };
    if (!numeric(x) || !numeric(y)) throw bad();
    auto as_int = [](const Json& j) -> std::int64_t { return j.is_boolean() ? j.get<bool>() : j.get<std::int64_t>(); };
    auto as_dbl = [](const Json& j) -> double { return j.is_boolean() ? j.get<bool>() : j.get<double>(); };
    bool ints = !x.is_number_float() && !y.is_number_float();
    if (ints && op != "/") {
      std::int64_t p = as_int(x), q = as_int(y), r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(p, q, &r)) throw EvalFail{"integer overflow"};
      } else if (op == "-") {
        if (__builtin_sub_overflow(p, q, &r)) throw EvalFail{"integer overflow"};
      } else if (op == "*") {
        if (__builtin_mul_overflow(p, q, &r)) throw EvalFail{"integer overflow"};
      } else if (op == "//" || op == "%") {
        if (q == 0) throw EvalFail{"integer division or modulo by zero"};
        if (p == INT64_MIN && q == -1) throw EvalFail{"integer overflow"};
        std::int64_t d = p / q, m = p % q;
        if (m != 0 && ((m < 0) != (q < 0))) {  // Python floors
          d -= 1;
          m += q;
        }
        r = op == "//" ? d : m;
      } else if (op == "**") {
        if (q < 0) return Value(Json(std::pow(static_cast<double>(p), static_cast<double>(q))));
        r = 1;
        for (std::int64_t i = 0; i < q; ++i)
          if (__builtin_mul_overflow(r, p, &r)) throw EvalFail{"integer overflow"};
      } else {
        throw bad();
      }
      return Value(Json(r));
    }
    double p = as_dbl(x), q = as_dbl(y);
    if (op == "+") return Value(Json(p + q));
    if (op == "-") return Value(Json(p - q));
    if (op == "*") return Value(Json(p * q));
    if (op == "**") return Value(Json(std::pow(p, q)));
    if (q == 0) throw EvalFail{"division by zero"};
    if (op == "/") return Value(Json(p / q));
    if (op == "//") return Value(Json(std::floor(p / q)));
    if (op == "%") {
      double m = std::fmod(p, q);
      if (m != 0 && ((m < 0) != (q < 0))) m += q;
      return Value(Json(m));
    }
    throw bad();
  }

  const Program& prog_;
  const RenderOptions& opt_;
  std::string* out_ = nullptr;
  std::vector<std::pair<std::size_t, std::size_t>>* spans_ = nullptr;
  std::size_t steps_ = 0;
  int capturing_ = 0;
  int loop_depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace ax::jinja::detail

namespace ax::jinja {

Error::Error(std::string name, int line, int column, std::string message, bool raised)
    : std::runtime_error(name + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message),
      line_(line), column_(column), message_(std::move(message)), raised_(raised) {}

Template::Template(std::string_view source, std::string name)
    : program_(detail::parse(detail::lex(source, name), name)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

RenderResult Template::render(const Json& context, const RenderOptions& options) const {
  return detail::Renderer(*program_, options).run(context);
}
Json chat_context(const Json& messages, const Json& tools, bool add_generation_prompt, const Json& extra) {
  Json ctx = Json::object();
  Json msgs = Json::array();
  for (const Json& m : messages) {
    const Json* reasoning = nullptr;
    if (m.is_object())
      for (const char* f : {"reasoning_content", "thinking", "reasoning"}) {
        auto it = m.find(f);
        if (it != m.end() && !it->is_null()) {
          reasoning = &*it;
          break;
        }
      }
    if (!reasoning) {
      msgs.push_back(m);
      continue;
    }
    // {"thinking": r, **message, "reasoning_content": r}: `thinking` keeps the message's own value and place
    // when it has one, reasoning_content is always r.
    Json a = Json::object();
    a["thinking"] = *reasoning;
    for (const auto& [k, v] : m.items()) a[k] = v;
    a["reasoning_content"] = *reasoning;
    msgs.push_back(std::move(a));
  }
  ctx["messages"] = std::move(msgs);
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : extra.items())
    if (!ctx.contains(k)) ctx[k] = v;
  return ctx;
}

bool Template::has_generation() const { return program_->has_generation; }
const std::string& Template::name() const { return program_->name; }

}  // namespace ax::jinja
