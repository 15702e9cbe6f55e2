// generate_jsonl and chat_session (axengine/generation.hpp): what `axengine generate` and `axengine chat` do
// once their options are parsed.
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "axengine/chat_media.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/generation.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "data/chat_images.hpp"
#include "models/training_record.hpp"
#include "train/generate.hpp"
#include "train/generate_io.hpp"

namespace ax {
namespace {

// What a job generates with: its checked options, the tokenizer, the chat template (when prompts use it) with
// the template kwargs and end-of-turn ids, the prompt limit, and once loaded the model (+ adapter).
struct Session {
  std::string command;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<train::ChatPrompt> chat;
  std::vector<int64_t> end_of_turn;  // a prompt rendered through the template also ends at these
  int64_t max_prompt_tokens = 0;     // 0: no limit known
  std::string limit_source;          // where max_prompt_tokens comes from, for messages
  std::optional<models::TrainingRecord> record;  // the adapter's (or the merged model's) training record
  std::unique_ptr<Model> model;
  CausalLmDecode* decoder = nullptr;
  train::GenerateOptions options;
  std::string model_dir;
  std::vector<std::string> images;           // --image, absolute
  std::optional<data::ImageSetup> image_setup;  // the model's image processor, found for the first image
};

// A chat prompt's tokens and its images as the model's processor makes them (empty: none).
struct ChatPromptInput {
  std::vector<int32_t> tokens;
  DecodeImages images;
};

// Everything but the model: what requests are checked against before it loads.
Session open_session(const GenerationJob& job, const std::string& command, bool chat) {
  Session s;
  s.command = command;
  s.model_dir = job.model_dir;
  for (const auto& f : job.images) s.images.push_back(std::filesystem::absolute(f).string());
  train::GenerateOptions& g = s.options;
  g.max_new_tokens = job.max_new_tokens;
  g.sampling = job.sampling;
  g.stop = job.stop;
  g.batch_size = job.batch_size;
  try {
    train::check_sampling(g.sampling);
    if (g.max_new_tokens < 0) throw UsageError(str("max_new_tokens must be >= 0, got ", g.max_new_tokens));
    if (g.batch_size < 1) throw UsageError(str("batch size must be >= 1, got ", g.batch_size));
    if (job.max_prompt_tokens < 0) throw UsageError(str("max_prompt_tokens must be >= 0, got ", job.max_prompt_tokens));
    for (const auto& st : g.stop)
      if (st.empty()) throw UsageError("a stop string must not be empty");
  } catch (const UsageError& e) {
    throw UsageError(command + ": " + e.what());
  }
  s.record = job.adapter_dir.empty() ? models::read_merged_training_record(job.model_dir)
                                     : models::read_training_record(job.adapter_dir);
  // A prompt longer than the model's positions is not one it can answer, and its prefill (attention over every
  // pair of its tokens) could take hours: refused before anything is decoded.
  if (job.max_prompt_tokens > 0) {
    s.max_prompt_tokens = job.max_prompt_tokens;
    s.limit_source = str("--max-prompt-tokens ", job.max_prompt_tokens);
  } else if ((s.max_prompt_tokens = train::model_max_positions(job.model_dir)) > 0) {
    s.limit_source = str("the model's max_position_embeddings (", s.max_prompt_tokens, ", ", job.model_dir,
                         "/config.json; --max-prompt-tokens sets another limit)");
  }
  if (chat) {
    s.chat = train::ChatPrompt::load(job.model_dir);  // a missing template fails before the model loads
    std::optional<nlohmann::json> kwargs = job.template_kwargs;
    if (!kwargs && s.record) {
      std::string why;
      kwargs = models::default_template_kwargs(*s.record, why);
      if (!why.empty()) log::warn(str(command, ": ", why, ": none applied; pass --template-kwargs"));
      else if (kwargs && !kwargs->empty())
        log::info(str(command, ": template kwargs ", kwargs->dump(), " (the training run's, from its ",
                      job.adapter_dir.empty() ? models::kMergeRecordFile : models::kTrainingRecordFile, ")"));
    }
    if (kwargs) s.chat->set_template_kwargs(*kwargs);
  }
  s.tokenizer = load_hf_tokenizer(job.model_dir);
  if (s.chat) s.end_of_turn = train::chat_end_of_turn_ids(*s.chat, *s.tokenizer);
  g.eos_ids = train::model_eos_ids(job.model_dir);
  if (g.eos_ids.empty() && s.tokenizer->eos_id() >= 0) g.eos_ids = {s.tokenizer->eos_id()};
  if (g.eos_ids.empty() && s.end_of_turn.empty())
    log::warn(command + ": the model names no eos token: answers end at the token limit or a stop string");
  const Tokenizer* tok = s.tokenizer.get();
  g.detokenize = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, /*skip_special_tokens=*/false); };
  return s;
}

// The model (+ adapter) on the engine's device and dtype. An adapter trained on a packed base (QLoRA) gets that
// base again, as its training record says: on the dense base it would be another model.
void load_session_model(const Engine& engine, const GenerationJob& job, Session& s) {
  ModelLoadOptions o;
  o.dir = job.model_dir;
  o.dtype = engine.dtype;
  o.device = engine.device.is_cuda() ? str("cuda:", engine.device.index) : "cpu";
  o.kernels = engine.kernel_set();
  o.adapter_dir = job.adapter_dir;
  if (s.record && !job.adapter_dir.empty()) {
    o.weights = s.record->weights;
    if (o.weights.format != "dense")
      log::info(str(s.command, ": the base is packed as the adapter was trained: ", models::describe_weights(o.weights)));
  }
  s.model = load_model(engine.registry, o);
  if (!job.adapter_dir.empty())
    models::check_trained_base(s.record, job.adapter_dir, job.model_dir, s.model->weight_stats().format, s.command);
  s.model->set_training(false);
  s.decoder = &train::decoder_of(*s.model);
}

// --image's files as image parts before the text of the conversation's first user message.
void add_image_parts(jinja::Json& messages, const std::vector<std::string>& files) {
  for (auto& m : messages) {
    if (!m.is_object() || m.value("role", "") != "user") continue;
    jinja::Json parts = jinja::Json::array();
    for (const auto& f : files) parts.push_back({{"type", "image"}, {"image", f}});
    auto c = m.find("content");
    if (c != m.end() && c->is_string()) parts.push_back({{"type", "text"}, {"text", *c}});
    else if (c != m.end() && c->is_array())
      for (const auto& p : *c) parts.push_back(p);
    m["content"] = std::move(parts);
    return;
  }
  throw UsageError("--image: the conversation has no user message to hold the images");
}

// `messages` (with --image's files added) rendered through the chat template, its image parts (the chat_template
// type's formats, data/chat_images.hpp; relative paths against `base_dir`) expanded by the model's image
// processor (a plugin's: axengine/chat_media.hpp) into their tokens and processed into their pixels.
ChatPromptInput chat_prompt(Session& s, const Engine& engine, jinja::Json messages, const std::string& base_dir) {
  if (!s.images.empty()) add_image_parts(messages, s.images);
  data::ChatImages found;
  if (std::string why = data::read_chat_images(messages, jinja::Json(), "", found); !why.empty()) throw UsageError(why);
  std::string text = s.chat->render(messages, true);
  ChatPromptInput out;
  if (!found.paths.empty()) {
    for (auto& f : found.paths)
      if (std::filesystem::path(f).is_relative()) f = (std::filesystem::path(base_dir) / f).string();
    if (!s.image_setup) {
      DatasetContext ctx;
      ctx.tokenizer = s.tokenizer.get();
      ctx.model_dir = s.model_dir;
      ctx.image_processor = model_image_processor(s.model_dir);
      s.image_setup = data::find_image_processor(&engine.registry, ChatImageOptions{}, ctx);
    }
    if (!s.image_setup->processor)
      throw UsageError(str("message ", found.message[0], ": ", s.image_setup->why));
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    data::expand_image_markers(*s.image_setup->processor, found.paths, found.message, text, spans);
    Sample sample;
    s.image_setup->processor->add_extras(found.paths, sample);  // its errors name the file
    out.images = std::move(sample.extras);
  }
  out.tokens = s.tokenizer->encode(text, false);
  return out;
}

// "" when `tokens` fits the prompt limit, else why not.
std::string too_long(const Session& s, std::size_t tokens, const std::string& what) {
  if (s.max_prompt_tokens <= 0 || static_cast<int64_t>(tokens) <= s.max_prompt_tokens) return "";
  return str(what, " is ", tokens, " tokens, more than ", s.limit_source);
}

}  // namespace

void generate_jsonl(Engine& engine, const GenerationJob& job, const std::string& input, const std::string& output,
                    PromptMode mode) {
  // The requests first: a bad row fails before the model loads.
  std::ifstream in(input);
  if (!in) throw UsageError(str("generate: cannot read --input ", input));
  std::vector<train::GenerateRequest> requests;
  std::vector<int64_t> line_of;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    requests.push_back(train::parse_generate_request(line, str(input, ":", n)));
    line_of.push_back(n);
    auto& r = requests.back();
    if (r.is_chat && mode == PromptMode::raw)
      throw UsageError(str(input, ":", n, ": a \"messages\" row, but --raw renders no chat template"));
    if (!r.is_chat && mode == PromptMode::chat) {
      r.messages = jinja::Json::array({{{"role", "user"}, {"content", r.prompt}}});
      r.is_chat = true;
    }
  }
  bool any_chat = false;
  for (const auto& r : requests) any_chat |= r.is_chat;
  Session s = open_session(job, "generate", any_chat);

  // Every prompt tokenised and measured before the model loads: a row too long is an error naming it (exit 2).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int64_t>> prompt_eos;
  std::vector<DecodeImages> images;
  const std::string base_dir = std::filesystem::absolute(input).parent_path().string();  // a row's relative image paths
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    const std::string where = str(input, ":", line_of[i]);
    if (!r.is_chat && !job.images.empty())
      throw UsageError(str(where, ": --image goes into a user message, but a \"prompt\" row is raw text (--chat renders it as one)"));
    // A rendered template writes its special tokens itself (apply_chat_template(tokenize=True) adds none); raw
    // text gets what the tokenizer adds, as HF tokenizer(text).
    ChatPromptInput p;
    try {
      p = r.is_chat ? chat_prompt(s, engine, r.messages, base_dir)
                    : ChatPromptInput{s.tokenizer->encode(r.prompt, /*add_special_tokens=*/true), {}};
    } catch (const UsageError& e) {
      throw UsageError(str(where, ": ", e.what()));
    }
    prompts.push_back(std::move(p.tokens));
    images.push_back(std::move(p.images));
    if (prompts.back().empty()) throw UsageError(str(where, ": the request tokenizes to nothing"));
    if (auto why = too_long(s, prompts.back().size(), "the prompt"); !why.empty()) throw UsageError(str(where, ": ", why));
    prompt_eos.push_back(r.is_chat ? s.end_of_turn : std::vector<int64_t>{});
  }
  load_session_model(engine, job, s);
  s.options.prompt_eos_ids = std::move(prompt_eos);
  auto gens = train::generate(*s.decoder, prompts, s.options, {}, {}, images);

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

void chat_session(Engine& engine, const GenerationJob& job, const std::string& system, const ReadLine& read_line,
                  std::ostream& out, std::ostream* notes) {
  // The template before the model: a model without one is refused at once, not after a long load.
  Session s = open_session(job, "chat", /*chat=*/true);
  auto fresh = [&] {
    jinja::Json m = jinja::Json::array();
    if (!system.empty()) m.push_back({{"role", "system"}, {"content", system}});
    return m;
  };
  if (!s.images.empty()) {  // --image's files read, and the model's processor found, before the model loads
    jinja::Json probe = fresh();
    probe.push_back({{"role", "user"}, {"content", ""}});
    try {
      chat_prompt(s, engine, probe, ".");
    } catch (const UsageError& e) {
      throw UsageError(str("chat: ", e.what()));
    }
  }
  load_session_model(engine, job, s);
  jinja::Json messages = fresh();
  if (notes) *notes << "axengine chat: " << job.model_dir << " (/reset: new conversation, /exit: quit)\n" << std::flush;
  uint64_t turn = 0, line_no = 0;
  while (true) {
    std::optional<std::string> line = read_line();
    if (!line) break;
    ++line_no;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    if (*line == "/exit") break;
    if (*line == "/reset") {
      messages = fresh();
      if (notes) *notes << "(new conversation)\n" << std::flush;
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", *line}});
    // The whole conversation is rendered and prefilled each turn: templates may rewrite earlier turns (Qwen3
    // drops past reasoning), so the previous turn's tokens are not always a prefix of this one's.
    ChatPromptInput p = chat_prompt(s, engine, messages, ".");  // --image paths are absolute already
    std::vector<std::vector<int32_t>> tokens{std::move(p.tokens)};
    if (auto why = too_long(s, tokens[0].size(), "the conversation with this turn"); !why.empty()) {
      if (!notes) throw UsageError(str("chat: input line ", line_no, ": ", why));
      messages.erase(messages.size() - 1);  // the turn is dropped; the conversation so far stays
      *notes << "chat: " << why << ": the turn is dropped (/reset starts a new conversation)\n" << std::flush;
      continue;
    }
    train::GenerateOptions o = s.options;
    o.sampling.seed = s.options.sampling.seed + turn++;  // a fresh draw each turn, reproducible
    o.prompt_eos_ids = {s.end_of_turn};
    auto gens = train::generate(*s.decoder, tokens, o, [&](std::size_t, const std::string& piece) { out << piece << std::flush; },
                                {}, {std::move(p.images)});
    out << "\n" << std::flush;
    messages.push_back({{"role", "assistant"}, {"content", gens[0].text}});
  }
}

}  // namespace ax
