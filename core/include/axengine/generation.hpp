// `axengine generate` and `axengine chat` as an API (the CLI only parses options): load a model dir (+ a PEFT
// adapter) through the engine's families, and answer a JSONL of prompts or hold a conversation, decoding with
// the family's KV cache (axengine/decode.hpp). docs/generate.md.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax {

class Engine;

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax, the first of equal maxima, as torch.argmax)
  double top_p = 1.0;        // keep the most likely tokens whose probabilities sum to top_p (at least one)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  uint64_t seed = 0;         // prompt i of a call samples from its own generator, seeded seed + i
};

struct GenerationJob {
  std::string model_dir;
  std::string adapter_dir;  // "" = none
  int64_t max_new_tokens = 256;
  SamplingOptions sampling;
  std::vector<std::string> stop;  // stop strings: cut from the text, they end the answer
  int64_t batch_size = 8;         // prompts decoded together
  // Extra chat-template variables (apply_chat_template's keyword arguments, e.g. {"enable_thinking": false}).
  // nullopt: those the training run rendered its chat_template data with (the adapter's training record, or a
  // merged model's), else none.
  std::optional<nlohmann::json> template_kwargs;
  // Longest prompt (in tokens; a chat's whole conversation) accepted; 0: config.json's max_position_embeddings.
  int64_t max_prompt_tokens = 0;
  // Image files (--image) put, in order, as image content parts before the text of the first user message of
  // every prompt rendered through the chat template (generate) or of every conversation (chat). For the
  // vision-language families; their processor comes from a plugin (mm_cpt). docs/generate.md.
  std::vector<std::string> images;
};

// --template-kwargs values: each a JSON object or key=value (the value read as JSON when it parses: false, 3,
// "x"; else the text itself). Merged in order, later keys winning. UsageError for anything else.
nlohmann::json parse_template_kwargs(const std::vector<std::string>& items);

// How `generate` treats the rows: as given ("prompt" raw, "messages" through the chat template), every
// "prompt" wrapped as one user message (chat), or no template at all (raw: "messages" rows refused).
enum class PromptMode { as_given, chat, raw };

// Reads `input` (JSONL rows {"prompt"} | {"messages"}, optional "id"; a bad row is a UsageError naming
// file:line, raised before the model loads) and writes one answer row per input row to `output`.
void generate_jsonl(Engine& engine, const GenerationJob& job, const std::string& input, const std::string& output,
                    PromptMode mode);

// The next line of user input without its newline; nullopt at the end of input. The terminal's reader
// (line editing, history: the CLI's) shows its own prompt.
using ReadLine = std::function<std::optional<std::string>()>;

// A conversation: each line `read_line` gives is a user turn whose answer streams to `out`, then a newline;
// "/reset" starts over, "/exit" or the end of input ends it. `notes` (the terminal's) receives the banner and
// what a turn that cannot be answered is refused for (a conversation longer than max_prompt_tokens: the turn is
// dropped, the conversation kept); null when not interactive, where such a turn is a UsageError instead.
// UsageError when the model has no chat template.
void chat_session(Engine& engine, const GenerationJob& job, const std::string& system, const ReadLine& read_line,
                  std::ostream& out, std::ostream* notes);

}  // namespace ax
