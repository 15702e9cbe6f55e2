// `axengine generate`'s untrusted inputs: a JSONL request row (parse_generate_request), then a model dir's
// tokenizer_config.json (ChatPrompt::load: its chat_template as a string or a list of {name, template}, and its
// special tokens), rendered for the row's messages (or a fixed conversation). Input: the row, then optionally a
// separator and tokenizer_config.json. Small render budgets, as in the chat_template harness.
#include "harness.hpp"

#include "axengine/error.hpp"
#include "train/generate_io.hpp"

AX_FUZZ_HARNESS(generate_request) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto parts = ax::fuzz::split_parts(in, 2);
  ax::jinja::Json messages = ax::jinja::Json::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"Hi"}])");
  try {
    auto r = ax::train::parse_generate_request(std::string(parts[0]), "in.jsonl:1");
    if (r.is_chat) messages = r.messages;
  } catch (const ax::UsageError&) {  // a refused row: the template part is still exercised
  }
  if (parts.size() < 2) return;
  const std::string dir = ax::fuzz::fresh_dir("generate_request");
  ax::fuzz::write_file(dir + "/tokenizer_config.json", parts[1]);
  auto chat = ax::train::ChatPrompt::load(dir);
  ax::jinja::RenderOptions opt;
  opt.max_steps = 200'000;
  opt.max_output_bytes = 1 << 20;
  opt.max_call_depth = 64;
  opt.now = std::tm{};
  (void)chat.render(messages, true, opt);
}
