// A chat template (a model dir's chat_template.jinja, or tokenizer_config.json's chat_template: untrusted) parsed
// and rendered by core/src/jinja, as the chat_template dataset type renders conversations. Input: the template,
// then optionally a separator and a JSON object of template variables (messages, tools, ...); without one, a
// fixed two-turn conversation. Budgets are small so a hostile template ends in an error fast, never a hang.
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "harness.hpp"

#include "axengine/error.hpp"
#include "jinja/jinja.hpp"

AX_FUZZ_HARNESS(chat_template) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto parts = ax::fuzz::split_parts(in, 2);
  ax::jinja::Json ctx;
  if (parts.size() > 1) {
    ctx = ax::jinja::Json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (!ctx.is_object()) throw ax::UsageError("chat_template: the context part is not a JSON object");
  } else {
    ctx = ax::jinja::chat_context(
        ax::jinja::Json::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"Hi ü"},)"
                               R"({"role":"assistant","content":"<think>r</think>ok","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}])"),
        nullptr, false, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  }
  ax::jinja::RenderOptions opt;
  opt.max_steps = 200'000;
  opt.max_output_bytes = 1 << 20;
  opt.max_call_depth = 64;
  std::tm fixed{};
  fixed.tm_year = 125;
  fixed.tm_mday = 1;
  opt.now = fixed;
  try {
    ax::jinja::Template t(parts[0], "chat_template.jinja");
    ax::jinja::RenderResult r = t.render(ctx, opt);
    // Generation spans lie inside the text, in order: the dataset type indexes the text with them.
    std::size_t prev = 0;
    for (const auto& [b, e] : r.generation)
      if (b < prev || e < b || e > r.text.size()) {
        std::fprintf(stderr, "chat_template: generation span [%zu, %zu) outside the text (%zu bytes)\n", b, e, r.text.size());
        std::abort();
      } else {
        prev = e;
      }
  } catch (const ax::jinja::Error& e) {
    throw ax::UsageError(e.what());
  }
}
