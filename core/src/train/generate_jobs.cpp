// generate_jsonl and chat_session (axengine/generation.hpp): what `axengine generate` and `axengine chat` do
// once their options are parsed.
#include <filesystem>
#include <fstream>
#include <istream>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/generation.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "train/generate.hpp"
#include "train/generate_io.hpp"

namespace ax {
namespace {

// The model (+ adapter) on the engine's device and dtype, its tokenizer, and the options of the job with the
// model's eos ids and a detokenizer filled in.
struct Session {
  std::unique_ptr<Model> model;
  CausalLmDecode* decoder = nullptr;
  std::unique_ptr<Tokenizer> tokenizer;
  train::GenerateOptions options;
};

Session open_session(const Engine& engine, const GenerationJob& job, const std::string& command) {
  Session s;
  train::GenerateOptions& g = s.options;
  g.max_new_tokens = job.max_new_tokens;
  g.sampling = job.sampling;
  g.stop = job.stop;
  g.batch_size = job.batch_size;
  try {
    train::check_sampling(g.sampling);
    if (g.max_new_tokens < 0) throw UsageError(str("max_new_tokens must be >= 0, got ", g.max_new_tokens));
    if (g.batch_size < 1) throw UsageError(str("batch size must be >= 1, got ", g.batch_size));
    for (const auto& st : g.stop)
      if (st.empty()) throw UsageError("a stop string must not be empty");
  } catch (const UsageError& e) {
    throw UsageError(command + ": " + e.what());
  }
  ModelLoadOptions o;
  o.dir = job.model_dir;
  o.dtype = engine.dtype;
  o.device = engine.device.is_cuda() ? str("cuda:", engine.device.index) : "cpu";
  o.kernels = engine.kernel_set();
  o.adapter_dir = job.adapter_dir;
  s.tokenizer = load_hf_tokenizer(job.model_dir);
  s.model = load_model(engine.registry, o);
  s.model->set_training(false);
  s.decoder = &train::decoder_of(*s.model);
  g.eos_ids = train::model_eos_ids(job.model_dir);
  if (g.eos_ids.empty() && s.tokenizer->eos_id() >= 0) g.eos_ids = {s.tokenizer->eos_id()};
  if (g.eos_ids.empty()) log::warn(command + ": the model names no eos token: answers end at the token limit or a stop string");
  const Tokenizer* tok = s.tokenizer.get();
  g.detokenize = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, /*skip_special_tokens=*/false); };
  return s;
}

}  // namespace

void generate_jsonl(Engine& engine, const GenerationJob& job, const std::string& input, const std::string& output,
                    PromptMode mode) {
  // The requests first: a bad row fails before the model loads.
  std::ifstream in(input);
  if (!in) throw UsageError(str("generate: cannot read --input ", input));
  std::vector<train::GenerateRequest> requests;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    requests.push_back(train::parse_generate_request(line, str(input, ":", n)));
    auto& r = requests.back();
    if (r.is_chat && mode == PromptMode::raw)
      throw UsageError(str(input, ":", n, ": a \"messages\" row, but --raw renders no chat template"));
    if (!r.is_chat && mode == PromptMode::chat) {
      r.messages = jinja::Json::array({{{"role", "user"}, {"content", r.prompt}}});
      r.is_chat = true;
    }
  }
  std::optional<train::ChatPrompt> chat;
  for (const auto& r : requests)
    if (r.is_chat && !chat) chat = train::ChatPrompt::load(job.model_dir);  // a missing template fails before the load

  Session s = open_session(engine, job, "generate");
  std::vector<std::vector<int32_t>> prompts;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    // A rendered template writes its special tokens itself (apply_chat_template(tokenize=True) adds none); raw
    // text gets what the tokenizer adds, as HF tokenizer(text).
    prompts.push_back(r.is_chat ? s.tokenizer->encode(chat->render(r.messages, true), false)
                                : s.tokenizer->encode(r.prompt, /*add_special_tokens=*/true));
    if (prompts.back().empty()) throw UsageError(str(input, ": request ", i + 1, " tokenizes to nothing"));
  }
  auto gens = train::generate(*s.decoder, prompts, s.options);

  const std::string tmp = output + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UsageError(str("generate: cannot write ", tmp));
    for (std::size_t i = 0; i < gens.size(); ++i) {
      nlohmann::ordered_json row;
      if (!requests[i].id.is_null()) row["id"] = requests[i].id;
      row["text"] = gens[i].text;
      row["tokens"] = gens[i].tokens;
      row["finish_reason"] = gens[i].finish_reason;
      row["prompt_tokens"] = prompts[i].size();
      out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    out.close();
    if (!out) throw RuntimeError(str("generate: writing ", tmp, " failed"));
  }
  std::filesystem::rename(tmp, output);  // the output appears whole or not at all
  log::info(str("generate: ", gens.size(), " answers written to ", output));
}

void chat_session(Engine& engine, const GenerationJob& job, const std::string& system, std::istream& in,
                  std::ostream& out, std::ostream* prompt) {
  // The template before the model: a model without one is refused at once, not after a long load.
  const auto chat = train::ChatPrompt::load(job.model_dir);
  Session s = open_session(engine, job, "chat");
  auto fresh = [&] {
    jinja::Json m = jinja::Json::array();
    if (!system.empty()) m.push_back({{"role", "system"}, {"content", system}});
    return m;
  };
  jinja::Json messages = fresh();
  if (prompt) *prompt << "axengine chat: " << job.model_dir << " (/reset: new conversation, /exit: quit)\n";
  std::string line;
  uint64_t turn = 0;
  while (true) {
    if (prompt) *prompt << "> " << std::flush;
    if (!std::getline(in, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") break;
    if (line == "/reset") {
      messages = fresh();
      if (prompt) *prompt << "(new conversation)\n";
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    // The whole conversation is rendered and prefilled each turn: templates may rewrite earlier turns (Qwen3
    // drops past reasoning), so the previous turn's tokens are not always a prefix of this one's.
    std::vector<std::vector<int32_t>> tokens{s.tokenizer->encode(chat.render(messages, true), false)};
    train::GenerateOptions o = s.options;
    o.sampling.seed = s.options.sampling.seed + turn++;  // a fresh draw each turn, reproducible
    auto gens = train::generate(*s.decoder, tokens, o, [&](std::size_t, const std::string& piece) { out << piece << std::flush; });
    out << "\n" << std::flush;
    messages.push_back({{"role", "assistant"}, {"content", gens[0].text}});
  }
}

}  // namespace ax
