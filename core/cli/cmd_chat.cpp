// axengine chat --model DIR [--adapter DIR] [--system TEXT] [sampling options]: a conversation through the
// model's chat template, one user turn per stdin line, answers streamed to stdout. On a terminal it prompts on
// stderr and edits the line (line_reader.hpp); with stdin not a terminal (a pipe, a file) it prints only the
// answers, one per line, so it can be scripted and tested (axengine/generation.hpp, docs/generate.md).
#include <unistd.h>

#include <iostream>

#include "command.hpp"
#include "gen_options.hpp"
#include "line_reader.hpp"

namespace {

int run_chat(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("chat options");
  ax::cli::add_generation_options(opts);
  opts.add_options()("system", po::value<std::string>()->default_value(""), "a system message that starts every conversation");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine chat --model DIR [--adapter DIR] [--system TEXT] [--max-new-tokens N] "
                              "[--temperature T] [--top-p P] [--seed S] [--stop STR]... [--template-kwargs K=V]...",
                              args, opts, vm))
    return 0;
  ax::StartOptions start;
  ax::GenerationJob job = ax::cli::generation_job("chat", vm, start);
  auto engine = ax::Engine::start(start);
  const bool tty = ::isatty(STDIN_FILENO) == 1;
  ax::chat_session(*engine, job, vm["system"].as<std::string>(), ax::cli::make_line_reader(tty), std::cout,
                   tty ? &std::cerr : nullptr);
  return 0;
}

ax::cli::CommandRegistrar reg({"chat", "talk to a model through its chat template (stdin lines, streamed answers)", run_chat});

}  // namespace
