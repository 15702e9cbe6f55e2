#include "axengine/op_spec.hpp"

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax {

const OpTolerance& OpSpec::tolerance(const std::string& dtype) const {
  for (const auto& t : tolerances)
    if (t.dtype == dtype) return t;
  throw UsageError(str("op ", id, ": no tolerance row for dtype '", dtype, "'"));
}

}  // namespace ax
