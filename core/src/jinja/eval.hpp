#pragma once
// The evaluator's interface to the built-in filters, tests and methods (builtins.cpp). Internal.

#include <string>
#include <vector>

#include "jinja/ast.hpp"
#include "jinja/value.hpp"

namespace ax::jinja::detail {

// A failure inside a builtin; the evaluator adds the template position of the expression being evaluated.
struct EvalFail {
  std::string message;
};
// raise_exception(message): the template's own refusal.
struct EvalRaise {
  std::string message;
};

class Renderer;

// Arguments of a call, filter or test: positional, then keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  Renderer* renderer = nullptr;
  // The i-th positional argument or the keyword `name`; `fallback` where neither is given.
  Value get(std::size_t i, const char* name, Value fallback = Value()) const;
  bool has(std::size_t i, const char* name) const;
  // Fails on a keyword that is not in `allowed` or more positionals than allowed (a typo'd argument is an
  // error, not silently ignored).
  void check(const char* what, std::size_t max_pos, std::initializer_list<const char*> allowed) const;
};

Value apply_filter(const std::string& name, const Value& v, Args& args);
bool apply_test(const std::string& name, const Value& v, Args& args);
// A method of a str, list or dict value bound to it (Value::callable), or undefined when there is none.
Value bound_method(const Value& obj, const std::string& name);
// The global functions every template sees: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> global_functions(const RenderOptions& opt);

// Python semantics shared by the evaluator and the builtins.
bool py_equal(const Value& a, const Value& b);
int py_compare(const Value& a, const Value& b);  // <0, 0, >0; EvalFail where Python raises TypeError
bool py_contains(const Value& container, const Value& item);
// Elements of an iterable as values (a list's items, a dict's keys, a string's characters); undefined: none.
std::vector<Value> iterate(const Value& v);
Value getattr(const Value& obj, const std::string& name);   // Jinja's getattr: method, then member
Value getitem(const Value& obj, const Value& key);          // Jinja's getitem: item, then attribute
std::string value_str(const Value& v);  // str() that refuses nothing (undefined -> "")

}  // namespace ax::jinja::detail
