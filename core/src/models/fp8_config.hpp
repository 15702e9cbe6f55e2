// The fp8 quantization_config of a config.json (fine-grained FP8 checkpoints: models/fp8_load.hpp says how their
// tensors load). Pure parsing, no tensors, so HfConfig can hold it without the loader's headers.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ax::models {

struct Fp8Config {
  bool present = false;        // quantization_config.quant_method is "fp8"
  int64_t block_rows = 128;    // weight_block_size[0]: output rows per scale
  int64_t block_cols = 128;    // weight_block_size[1]: input columns per scale
};

// quantization_config of a config.json (`source` names the file); present = false unless quant_method is "fp8".
// Refused (naming the key): weight_block_size null (per-tensor FP8) or not two positive sizes, activation_scheme
// other than dynamic (static input scales would quantise the activations too), fmt other than e4m3, scale_fmt
// ue8m0 (power-of-two scales), expert_dtype fp4, keys FineGrainedFP8Config does not have.
Fp8Config parse_fp8_config(const nlohmann::json& hf_config, const std::string& source);

}  // namespace ax::models
