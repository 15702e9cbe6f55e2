#include "axengine/error.hpp"

#include "axengine/strings.hpp"

namespace ax {

ConfigError::ConfigError(const std::string& f, int l, int c, const std::string& m)
    : UsageError(l > 0 ? str(f, ":", l, ":", c, ": ", m) : str(f, ": ", m)), file(f), line(l), column(c), message(m) {}

}  // namespace ax
