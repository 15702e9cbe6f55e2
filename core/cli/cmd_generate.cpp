// axengine generate --model DIR [--adapter DIR] --input prompts.jsonl --output out.jsonl [--chat|--raw] ...
// Each input row is {"prompt": text} (tokenized as is, with the tokenizer's special tokens, as HF
// tokenizer(text) does) or {"messages": [...]} (rendered with the model's chat template,
// add_generation_prompt = true); each output row holds the answer: {"id"?, "text", "tokens", "finish_reason",
// "prompt_tokens"}, in input order. docs/generate.md.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "command.hpp"
#include "gen_session.hpp"
#include "train/generate_io.hpp"

namespace {

int run_generate(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("generate options");
  ax::cli::add_generation_options(opts);
  opts.add_options()("input", po::value<std::string>(), "JSONL of requests: {\"prompt\": ...} or {\"messages\": [...]}, optional \"id\"")(
      "output", po::value<std::string>(), "JSONL of answers, one per input row, in order")(
      "chat", "wrap every \"prompt\" row as one user message and render it with the chat template")(
      "raw", "no chat template: refuse \"messages\" rows")(
      "batch-size", po::value<int64_t>()->default_value(8), "prompts decoded together");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine generate --model DIR [--adapter DIR] --input IN.jsonl --output OUT.jsonl "
                              "[--max-new-tokens N] [--temperature T] [--top-p P] [--seed S] [--stop STR]... [--chat|--raw]",
                              args, opts, vm))
    return 0;
  for (const char* k : {"input", "output"})
    if (!vm.count(k)) throw ax::UsageError(std::string("generate: --") + k + " is required");
  if (vm.count("chat") && vm.count("raw")) throw ax::UsageError("generate: --chat and --raw exclude each other");
  const std::string input = vm["input"].as<std::string>(), output = vm["output"].as<std::string>();

  // The requests first: a bad row fails before the model loads.
  std::ifstream in(input);
  if (!in) throw ax::UsageError(ax::str("generate: cannot read --input ", input));
  std::vector<ax::train::GenerateRequest> requests;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    requests.push_back(ax::train::parse_generate_request(line, ax::str(input, ":", n)));
    auto& r = requests.back();
    if (r.is_chat && vm.count("raw"))
      throw ax::UsageError(ax::str(input, ":", n, ": a \"messages\" row, but --raw renders no chat template"));
    if (!r.is_chat && vm.count("chat")) {
      r.messages = ax::jinja::Json::array({{{"role", "user"}, {"content", r.prompt}}});
      r.is_chat = true;
    }
  }

  auto s = ax::cli::open_session("generate", vm);
  s.options.batch_size = vm["batch-size"].as<int64_t>();
  std::optional<ax::train::ChatPrompt> chat;
  std::vector<std::vector<int32_t>> prompts;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.is_chat) {
      if (!chat) chat = ax::train::ChatPrompt::load(s.model_dir);
      // The template writes the special tokens itself (transformers' apply_chat_template(tokenize=True) adds none).
      prompts.push_back(s.tokenizer->encode(chat->render(r.messages, /*add_generation_prompt=*/true), false));
    } else {
      prompts.push_back(s.tokenizer->encode(r.prompt, /*add_special_tokens=*/true));
    }
    if (prompts.back().empty()) throw ax::UsageError(ax::str(input, ": row ", i + 1, " of the requests tokenizes to nothing"));
  }
  auto gens = ax::train::generate(*s.decoder, prompts, s.options);

  const std::string tmp = output + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ax::UsageError(ax::str("generate: cannot write ", tmp));
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
    if (!out) throw ax::RuntimeError(ax::str("generate: writing ", tmp, " failed"));
  }
  std::filesystem::rename(tmp, output);  // the output appears whole or not at all
  ax::log::info(ax::str("generate: ", gens.size(), " answers written to ", output));
  return 0;
}

ax::cli::CommandRegistrar reg({"generate", "generate answers for a JSONL of prompts (KV-cached; greedy or sampled)", run_generate});

}  // namespace
