// The CLI's subcommands. Each lives in its own cli/cmd_<name>.cpp and registers itself with a static
// CommandRegistrar, so adding a command touches no shared file:
//
//   static ax::cli::CommandRegistrar reg({"inspect", "show a model directory's architecture", run_inspect});
//
// `run` gets the arguments after the command name (for "plugins list": name "plugins", args ["list", ...])
// and returns the exit code. Throwing ax::UsageError / ax::ConfigError exits 2 with the message;
// anything else exits 1. Commands parse their options with Boost.Program_options and answer --help.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace ax::cli {

struct Command {
  std::string name;
  std::string summary;
  std::function<int(const std::vector<std::string>& args)> run;
};

std::vector<Command>& commands();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { commands().push_back(std::move(c)); }
};

// Parses `args` against `options` (plus --help). Returns false when --help was printed (the caller
// returns 0). Unknown options and bad values throw UsageError naming the option.
bool parse_options(const std::string& usage, const std::vector<std::string>& args,
                   boost::program_options::options_description& options,
                   boost::program_options::variables_map& vm,
                   const boost::program_options::positional_options_description* positional = nullptr);

}  // namespace ax::cli
