// Learning rate per optimizer step: linear warmup from 0, then constant, linear or cosine decay to
// lr * min_lr_ratio at the last step. A pure function of the step, so resume needs no schedule state
// beyond the step count.
#pragma once
#include <cstdint>
#include <string>

namespace ax::train {

struct Schedule {
  std::string kind = "cosine";  // constant | linear | cosine
  double lr = 2e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;

  double at(int64_t step) const;  // step: 0-based index of the optimizer step about to run
};

}  // namespace ax::train
