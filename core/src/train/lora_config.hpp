// The [lora] section: the adapter trained by `run` (ax::LoraSpec for the model families).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/model.hpp"

namespace ax::train {

struct LoraConfig {
  LoraSpec spec;          // lora.targets and lora.vision_targets included
  std::string init_from;  // a PEFT adapter directory to continue training ("" = fresh adapter)
};

LoraConfig read_lora_config(const RunConfig& config);

// With lora.init_from, the adapter's adapter_config.json (and its tensors' dtype) fixes the adapter's rank, alpha,
// dropout, rslora, targets and dtype, as peft's PeftModel.from_pretrained does: a [lora] key that the config sets
// too must agree, or the run is refused (exit 2) naming the key, both values and the file. `compute_dtype` is the
// run's ("fp32", "bf16", "fp16"). An adapter that cannot be read is left to the model load to report.
void check_init_from(const RunConfig& config, const LoraConfig& lora, const std::string& compute_dtype);

}  // namespace ax::train
