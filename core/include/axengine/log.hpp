// Logging facade. The implementation (core/src/log/log.cpp) uses spdlog, which Debian builds on fmt 9,
// while the torch wheel's include dir carries fmt 12: that file is compiled without torch's include
// dirs, and nothing here includes spdlog or fmt. Callers build their message as a std::string
// (ax::str in strings.hpp is the usual way).
#pragma once
#include <string>
#include <string_view>

namespace ax::log {

enum class Level { trace, debug, info, warn, error, off };

void set_level(Level level);
Level level();
// Parses "trace|debug|info|warn|error|off"; returns false on anything else.
bool parse_level(std::string_view text, Level& out);

void write(Level level, std::string_view message);
inline void trace(std::string_view m) { write(Level::trace, m); }
inline void debug(std::string_view m) { write(Level::debug, m); }
inline void info(std::string_view m) { write(Level::info, m); }
inline void warn(std::string_view m) { write(Level::warn, m); }
inline void error(std::string_view m) { write(Level::error, m); }

}  // namespace ax::log
