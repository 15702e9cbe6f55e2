// Hugging Face checkpoints saved by transformers + bitsandbytes in 4-bit form (docs/weights.md, "Pre-quantised
// checkpoints"): config.json's quantization_config, and the JSON each packed Linear carries in its tensor
// "<weight>.quant_state.bitsandbytes__nf4" (bitsandbytes QuantState.as_dict(packed=True)). Both are untrusted
// input: anything missing, ill-typed or unsupported is a UsageError naming the file (and the tensor).
// Pure parsing, no tensors: tests/fuzz/hf_config.cpp and tests/fuzz/bnb_quant_state.cpp drive it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ax::models {

struct BnbConfig {
  bool present = false;                   // config.json has a bitsandbytes 4-bit quantization_config
  std::string quant_type;                 // bnb_4bit_quant_type: always "nf4" once parsed (fp4 is refused)
  bool double_quant = false;              // bnb_4bit_use_double_quant
  std::string compute_dtype;              // bnb_4bit_compute_dtype, as written (informative)
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules: modules bitsandbytes left unpacked
};

// quantization_config of a config.json (`source` names the file). Absent or null: present = false. A
// quant_method other than bitsandbytes, 8-bit, fp4, or a storage dtype other than uint8 is refused.
BnbConfig parse_bnb_config(const nlohmann::json& hf_config, const std::string& source);

// The non-tensor part of a bitsandbytes QuantState, as as_dict(packed=True) writes it.
struct BnbQuantState {
  std::string quant_type;        // "nf4"
  int64_t blocksize = 0;         // elements of the flattened weight per absmax
  std::string dtype;             // the weight's dtype before packing: float32 | bfloat16 | float16
  std::vector<int64_t> shape;    // the logical shape of the weight
  bool nested = false;           // double quantisation (compress_statistics)
  int64_t nested_blocksize = 0;  // absmax per nested absmax (256)
  std::string nested_dtype;      // float32
  double nested_offset = 0.0;    // the mean absmax subtracted before quantising them (an fp32 value)
  int64_t numel() const;
};

// `bytes` is the UTF-8 JSON held by the quant_state tensor; `where` names file and tensor for messages.
BnbQuantState parse_bnb_quant_state(std::string_view bytes, const std::string& where);

}  // namespace ax::models
