#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace ax::train {

double Schedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == "constant") return lr;
  int64_t span = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  double progress = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  double scale = kind == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * scale);
}

}  // namespace ax::train
