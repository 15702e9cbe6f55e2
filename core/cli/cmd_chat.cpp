// axengine chat --model DIR [--adapter DIR] [--system TEXT] [sampling options]: a conversation with the
// model through its chat template. Each stdin line is a user turn; the answer streams to stdout as it is
// generated, then a newline. /reset starts a new conversation, /exit (or end of input) quits. On a terminal
// it prompts on stderr; with stdin not a terminal (a pipe, a file) it reads lines the same way but prints
// only the answers, one per line, so it can be scripted and tested. docs/generate.md.
#include <unistd.h>

#include <iostream>
#include <string>

#include "axengine/error.hpp"
#include "command.hpp"
#include "gen_session.hpp"
#include "train/generate_io.hpp"

namespace {

int run_chat(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("chat options");
  ax::cli::add_generation_options(opts);
  opts.add_options()("system", po::value<std::string>(), "a system message that starts every conversation");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine chat --model DIR [--adapter DIR] [--system TEXT] [--max-new-tokens N] "
                              "[--temperature T] [--top-p P] [--seed S] [--stop STR]...",
                              args, opts, vm))
    return 0;
  if (!vm.count("model")) throw ax::UsageError("chat: --model DIR is required");
  // The template before the model: a model without one is refused at once, not after a long load.
  auto chat = ax::train::ChatPrompt::load(vm["model"].as<std::string>());
  auto s = ax::cli::open_session("chat", vm);
  const bool tty = ::isatty(STDIN_FILENO) == 1;

  auto fresh = [&] {
    ax::jinja::Json m = ax::jinja::Json::array();
    if (vm.count("system")) m.push_back({{"role", "system"}, {"content", vm["system"].as<std::string>()}});
    return m;
  };
  ax::jinja::Json messages = fresh();
  if (tty) std::cerr << "axengine chat: " << s.model_dir << " (/reset: new conversation, /exit: quit)\n";
  std::string line;
  uint64_t turn = 0;
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") break;
    if (line == "/reset") {
      messages = fresh();
      if (tty) std::cerr << "(new conversation)\n";
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    // The whole conversation is rendered and prefilled each turn: templates may rewrite earlier turns (Qwen3
    // drops past reasoning), so the previous turn's tokens are not always a prefix of this one's.
    std::vector<std::vector<int32_t>> prompt{s.tokenizer->encode(chat.render(messages, true), false)};
    auto opts_turn = s.options;
    opts_turn.sampling.seed = s.options.sampling.seed + turn++;  // a fresh draw each turn, reproducible
    auto gens = ax::train::generate(*s.decoder, prompt, opts_turn, [](std::size_t, const std::string& piece) {
      std::cout << piece << std::flush;
    });
    std::cout << "\n" << std::flush;
    messages.push_back({{"role", "assistant"}, {"content", gens[0].text}});
  }
  return 0;
}

ax::cli::CommandRegistrar reg({"chat", "talk to a model through its chat template (stdin lines, streamed answers)", run_chat});

}  // namespace
