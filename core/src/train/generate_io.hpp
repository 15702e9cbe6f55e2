// What `axengine generate` and `chat` read from the user and the model dir: request rows (JSONL), the model's
// chat template with its special tokens, and the eos ids that end a generation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "axengine/tokenizer.hpp"
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
  // Extra template variables for every render, as apply_chat_template's **kwargs (e.g. enable_thinking):
  // a JSON object, over the special tokens where names clash (as transformers passes them).
  void set_template_kwargs(const jinja::Json& kwargs);

 private:
  std::shared_ptr<jinja::Template> template_;
  jinja::Json special_;
  std::string source_;
};

// The ids that end a generation: generation_config.json's eos_token_id (a number or a list), else
// config.json's; empty when neither names one.
std::vector<int64_t> model_eos_ids(const std::string& model_dir);

// The token that ends an assistant turn in `chat`'s template, as an id of `tokenizer`: a conversation of a user
// and a (last) assistant message is rendered, and the end-of-turn marker (data/chat_template.hpp's list:
// <|im_end|>, <|eot_id|>, <end_of_turn>, <|return|>, ...) that directly follows the assistant's text is taken
// when it is one token. Empty when the template ends turns otherwise, or refuses the probe conversation.
// Chat models list it among generation_config.json's eos ids; a model dir whose config names only the
// tokenizer's EOS (a tiny preset with a ChatML template) would otherwise run to the token limit.
std::vector<int64_t> chat_end_of_turn_ids(const ChatPrompt& chat, const Tokenizer& tokenizer);

// config.json's max_position_embeddings (a vision-language model's text_config's); 0 when it names none.
int64_t model_max_positions(const std::string& model_dir);

}  // namespace ax::train
