// What `axengine generate` and `chat` read from the user and the model dir: request rows (JSONL), the model's
// chat template with its special tokens, and the eos ids that end a generation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jinja/jinja.hpp"

namespace ax::train {

// One input row: {"prompt": "raw text"} or {"messages": [{"role": ..., "content": ...}, ...]}, with an
// optional "id" (any JSON value) copied to the output row. Other keys are refused.
struct GenerateRequest {
  std::string prompt;       // raw text (when !is_chat)
  jinja::Json messages;     // the conversation (when is_chat)
  bool is_chat = false;
  jinja::Json id;           // null when absent
};

// Parses one JSONL line; UsageError "<source>: <message>" (source = "file:line") for anything else.
GenerateRequest parse_generate_request(const std::string& line, const std::string& source);

// A model dir's chat template: chat_template.jinja, else tokenizer_config.json's chat_template (a string, or
// transformers' list of {name, template}: the one named "default"), rendered with the special tokens
// tokenizer_config.json names (bos_token, eos_token, pad_token, unk_token).
class ChatPrompt {
 public:
  // UsageError naming the directory when it has no chat template (or the template does not parse).
  static ChatPrompt load(const std::string& model_dir);
  // transformers' apply_chat_template(messages, add_generation_prompt=...). UsageError naming the template
  // when it refuses the conversation (its raise_exception) or fails.
  std::string render(const jinja::Json& messages, bool add_generation_prompt, const jinja::RenderOptions& options = {}) const;
  const std::string& source() const { return source_; }

 private:
  std::shared_ptr<jinja::Template> template_;
  jinja::Json special_;
  std::string source_;
};

// The ids that end a generation: generation_config.json's eos_token_id (a number or a list), else
// config.json's; empty when neither names one.
std::vector<int64_t> model_eos_ids(const std::string& model_dir);

}  // namespace ax::train
