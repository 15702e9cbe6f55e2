// axengine generate --model DIR [--adapter DIR] --input prompts.jsonl --output out.jsonl [--chat|--raw] ...
// (axengine/generation.hpp, docs/generate.md).
#include "axengine/error.hpp"
#include "command.hpp"
#include "gen_options.hpp"

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
  ax::StartOptions start;
  ax::GenerationJob job = ax::cli::generation_job("generate", vm, start);
  for (const char* k : {"input", "output"})
    if (!vm.count(k)) throw ax::UsageError(std::string("generate: --") + k + " is required");
  if (vm.count("chat") && vm.count("raw")) throw ax::UsageError("generate: --chat and --raw exclude each other");
  job.batch_size = vm["batch-size"].as<int64_t>();
  const auto mode = vm.count("chat") ? ax::PromptMode::chat : vm.count("raw") ? ax::PromptMode::raw : ax::PromptMode::as_given;
  auto engine = ax::Engine::start(start);
  ax::generate_jsonl(*engine, job, vm["input"].as<std::string>(), vm["output"].as<std::string>(), mode);
  return 0;
}

ax::cli::CommandRegistrar reg({"generate", "answer a JSONL of prompts (KV-cached; greedy or sampled)", run_generate});

}  // namespace
