// Error types and the CLI's exit codes. Everything the user can get wrong throws UsageError (config,
// command line, input files: exit 2); failures while doing valid work throw RuntimeError (exit 1).
// Messages name the file, key, tensor or argument at fault.
#pragma once
#include <stdexcept>
#include <string>

namespace ax {

enum ExitCode : int { kExitOk = 0, kExitRuntime = 1, kExitUsage = 2 };

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A config problem with its location: what() is "file:line:column: message".
struct ConfigError : UsageError {
  ConfigError(const std::string& file, int line, int column, const std::string& message);
  std::string file;
  int line, column;
  std::string message;
};

}  // namespace ax
