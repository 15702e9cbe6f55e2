// The [lora] section: the adapter trained by `run` (ax::LoraSpec for the model families).
#pragma once
#include <optional>
#include <string>

#include "axengine/config.hpp"
#include "axengine/model.hpp"

namespace ax::train {

struct LoraConfig {
  LoraSpec spec;
  std::string init_from;  // a PEFT adapter directory to continue training ("" = fresh adapter)
};

LoraConfig read_lora_config(const RunConfig& config);

}  // namespace ax::train
