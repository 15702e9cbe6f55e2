// axengine <command> [options]: dispatches to the self-registered commands (command.hpp).
#include <algorithm>
#include <exception>
#include <iostream>

#include <c10/util/Exception.h>

#include "axengine/error.hpp"
#include "axengine/interrupted.hpp"
#include "axengine/log.hpp"
#include "axengine/version.hpp"
#include "command.hpp"

namespace ax::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

bool parse_options(const std::string& usage, const std::vector<std::string>& args,
                   boost::program_options::options_description& options,
                   boost::program_options::variables_map& vm,
                   const boost::program_options::positional_options_description* positional) {
  namespace po = boost::program_options;
  options.add_options()("help,h", "show this help");
  try {
    po::command_line_parser parser(args);
    parser.options(options);
    if (positional) parser.positional(*positional);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << options << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (usage: " + usage + ")");
  }
  return true;
}

}  // namespace ax::cli

namespace {

void print_usage(std::ostream& os) {
  auto cmds = ax::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  os << "axengine " << ax::kVersion << ": LoRA/QLoRA fine-tuning engine\n\n"
     << "usage: axengine <command> [options]   (axengine <command> --help for each)\n\ncommands:\n";
  for (auto& c : cmds) {
    os << "  " << c.name;
    for (std::size_t i = c.name.size(); i < 18; ++i) os << ' ';
    os << c.summary << "\n";
  }
  os << "\nexit codes: 0 ok, 1 runtime failure, 2 usage or config error, 128 + N stopped by signal N (run: 130 SIGINT,\n"
     << "143 SIGTERM, 138 SIGUSR1, after a checkpoint)\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(std::cerr);
    return ax::kExitUsage;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(std::cout);
    return ax::kExitOk;
  }
  if (name == "--version") name = "version";
  auto& cmds = ax::cli::commands();
  auto it = std::find_if(cmds.begin(), cmds.end(), [&](auto& c) { return c.name == name; });
  if (it == cmds.end()) {
    std::cerr << "axengine: unknown command '" << name << "'\n\n";
    print_usage(std::cerr);
    return ax::kExitUsage;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->run(args);
  } catch (const ax::Interrupted& e) {
    ax::log::warn(e.what());
    return 128 + e.signal;
  } catch (const ax::UsageError& e) {
    ax::log::error(e.what());
    return ax::kExitUsage;
  } catch (const c10::Error& e) {
    // LibTorch's what() carries a C++ backtrace: the user gets its first line and what was being done; the
    // whole text goes to the debug log.
    std::string msg = e.what_without_backtrace();
    ax::log::debug(e.what());
    ax::log::error("axengine " + name + ": LibTorch: " + msg.substr(0, msg.find('\n')) + " (AXENGINE_LOG=debug shows the trace)");
    return ax::kExitRuntime;
  } catch (const std::exception& e) {
    ax::log::error(e.what());
    return ax::kExitRuntime;
  }
}
