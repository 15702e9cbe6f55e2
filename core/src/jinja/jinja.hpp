#pragma once
// A small Jinja interpreter for HF chat templates (docs/jinja.md lists the subset). It renders the way
// transformers' apply_chat_template does: Jinja2 with trim_blocks, lstrip_blocks and loop controls, Python
// semantics for values (str(), repr, json.dumps for tojson), raise_exception / strftime_now / namespace / dict
// globals, and {% generation %} blocks that mark what the assistant wrote. Templates are untrusted input
// (they come with model dirs): every error is an ax::jinja::Error naming the template's line and column, and
// rendering has step, depth and output budgets so a hostile template ends with an error, not a hang or a crash.
// No torch dependency: values are JSON (nlohmann::ordered_json, which keeps a dict's key order as Python does).

#include <cstddef>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::jinja {

using Json = nlohmann::ordered_json;

// A parse or render error. what() is "<name>:<line>:<column>: <message>"; raised() is true for a template's own
// raise_exception(message), whose message() is exactly the template's text (as transformers reports it).
class Error : public std::runtime_error {
 public:
  Error(std::string name, int line, int column, std::string message, bool raised = false);
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }
  bool raised() const { return raised_; }

 private:
  int line_, column_;
  std::string message_;
  bool raised_;
};

struct RenderOptions {
  // The time strftime_now() formats (local time); unset = now. Tests pin it so dated templates are reproducible.
  std::optional<std::tm> now;
  // Budgets against hostile templates: evaluated nodes, nesting of macro calls, and bytes of output.
  std::size_t max_steps = 50'000'000;
  int max_call_depth = 200;
  std::size_t max_output_bytes = std::size_t{256} << 20;
};

struct RenderResult {
  std::string text;
  // Byte ranges [begin, end) of text rendered inside {% generation %} ... {% endgeneration %}, in order.
  std::vector<std::pair<std::size_t, std::size_t>> generation;
};

namespace detail {
struct Program;
}

class Template {
 public:
  // Parses a template; `name` (a file path, usually) prefixes error messages. Throws Error.
  Template(std::string_view source, std::string name = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` (a JSON object: messages, tools, add_generation_prompt, bos_token, ...) as the
  // template's variables. Throws Error.
  RenderResult render(const Json& context, const RenderOptions& options = {}) const;

  // Whether the template has a {% generation %} block (transformers' assistant-mask marker).
  bool has_generation() const;
  const std::string& name() const;

 private:
  std::unique_ptr<detail::Program> program_;
};

// The variables transformers' apply_chat_template gives a chat template (render_jinja_template): messages (with
// its reasoning aliases: a message's reasoning_content / thinking / reasoning is also given as `thinking` and
// `reasoning_content`, which gpt-oss and Qwen3 templates read), tools and documents (null when absent),
// add_generation_prompt, then `extra` (special tokens such as bos_token / eos_token, template kwargs such as
// enable_thinking), which may override none of the former.
Json chat_context(const Json& messages, const Json& tools, bool add_generation_prompt, const Json& extra = Json::object());

}  // namespace ax::jinja
