#include "axengine/bench_result.hpp"

#include <ctime>

namespace ax {

std::string utc_date_today() {
  const std::time_t t = std::time(nullptr);
  std::tm u{};
  ::gmtime_r(&t, &u);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &u);
  return buf;
}

}  // namespace ax
