// The only translation unit that sees spdlog (see log.hpp for why).
#include "axengine/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>

namespace ax::log {
namespace {

spdlog::level::level_enum to_spd(Level l) {
  switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// Logs go to stderr so that stdout stays for the command's own output (tables, JSON).
spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("axengine");
    l->set_pattern("%^[%L]%$ %v");
    // A rank of a multi-process run (torchrun's variables, docs/distributed.md): its rank on every line from the
    // first one on, before the command knows it is distributed.
    const char* rank = std::getenv("RANK");
    const char* world = std::getenv("WORLD_SIZE");
    if (rank && *rank && world && *world && std::string_view(rank).find('%') == std::string_view::npos &&
        std::string_view(world).find('%') == std::string_view::npos)
      l->set_pattern(std::string("%^[%L]%$ [rank ") + rank + "/" + world + "] %v");
    Level initial = Level::info;
    if (const char* env = std::getenv("AXENGINE_LOG")) parse_level(env, initial);
    l->set_level(to_spd(initial));
    return l;
  }();
  return *instance;
}

}  // namespace

bool parse_level(std::string_view t, Level& out) {
  static const std::pair<std::string_view, Level> names[] = {
      {"trace", Level::trace}, {"debug", Level::debug}, {"info", Level::info},
      {"warn", Level::warn},   {"error", Level::error}, {"off", Level::off}};
  for (auto& [name, level] : names)
    if (t == name) { out = level; return true; }
  return false;
}

void set_level(Level level) { logger().set_level(to_spd(level)); }

Level level() {
  switch (logger().level()) {
    case spdlog::level::trace: return Level::trace;
    case spdlog::level::debug: return Level::debug;
    case spdlog::level::info: return Level::info;
    case spdlog::level::warn: return Level::warn;
    case spdlog::level::err: return Level::error;
    default: return Level::off;
  }
}

// A rank other than 0 of a multi-process run (torchrun's RANK): rank 0 speaks for the group, the others say
// only warnings and errors, whatever the config's log level, unless AXENGINE_LOG asks for more.
bool quiet_rank() {
  static const bool quiet = [] {
    const char* rank = std::getenv("RANK");
    return rank && *rank && std::string_view(rank) != "0" && !std::getenv("AXENGINE_LOG");
  }();
  return quiet;
}

void write(Level level, std::string_view message) {
  if (level < Level::warn && quiet_rank()) return;
  logger().log(to_spd(level), spdlog::string_view_t(message.data(), message.size()));
}

}  // namespace ax::log
