// `axengine generate` and `axengine chat` as an API (the CLI only parses options): load a model dir (+ a PEFT
// adapter) through the engine's families, and answer a JSONL of prompts or hold a conversation, decoding with
// the family's KV cache (axengine/decode.hpp). docs/generate.md.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

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
};

// How `generate` treats the rows: as given ("prompt" raw, "messages" through the chat template), every
// "prompt" wrapped as one user message (chat), or no template at all (raw: "messages" rows refused).
enum class PromptMode { as_given, chat, raw };

// Reads `input` (JSONL rows {"prompt"} | {"messages"}, optional "id"; a bad row is a UsageError naming
// file:line, raised before the model loads) and writes one answer row per input row to `output`.
void generate_jsonl(Engine& engine, const GenerationJob& job, const std::string& input, const std::string& output,
                    PromptMode mode);

// A conversation: each line of `in` is a user turn whose answer streams to `out`, then a newline; "/reset"
// starts over, "/exit" or the end of `in` ends it. `prompt` (the terminal's) receives the banner and "> "
// prompts; null when not interactive. UsageError when the model has no chat template.
void chat_session(Engine& engine, const GenerationJob& job, const std::string& system, std::istream& in,
                  std::ostream& out, std::ostream* prompt);

}  // namespace ax
