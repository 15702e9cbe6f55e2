// Reading the packed Linear weights of a bitsandbytes 4-bit checkpoint (bnb_config.hpp) as nf4 WeightTensors,
// byte for byte: the codes, absmax and nested fields are the checkpoint's own, never dequantised and repacked.
// Every malformed field is a UsageError naming the file and the tensor.
#pragma once
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"
#include "axengine/safetensors.hpp"
#include "models/bnb_config.hpp"

namespace ax::models {

// Whether weight `key` is stored packed: a 4-bit quant state (nf4 or fp4) lies beside it.
bool bnb_packed(const safetensors::Checkpoint& ckpt, const std::string& key);
// The tensors a packed weight consists of that are present (the weight itself first), for the unused-tensor
// check and inspect.
std::vector<std::string> bnb_field_keys(const safetensors::Checkpoint& ckpt, const std::string& key);
// The quant state JSON of packed weight `key`, parsed.
BnbQuantState read_bnb_quant_state(const safetensors::Checkpoint& ckpt, const std::string& key);

// Packed weight `key` against the logical `shape` the config implies, from its quant state (a small JSON
// tensor) and the headers: what read_bnb_nf4 checks before it reads the packed fields. Returns the state.
BnbQuantState check_bnb_weight(const safetensors::Checkpoint& ckpt, const std::string& key, const std::vector<int64_t>& shape);

// Packed weight `key` as an nf4 WeightTensor on the CPU. `shape` is the logical shape the config implies.
// The double-quant code is checked against ops::bnb_dynamic_map() and then shared: `nested_code` (undefined
// at first) is set by the first double-quantised weight and given to every later one.
ops::WeightTensor read_bnb_nf4(const safetensors::Checkpoint& ckpt, const std::string& key,
                               const std::vector<int64_t>& shape, at::Tensor& nested_code);

// Per-expert packed weights as one nf4 weight of `shape` ([E, ...], the parts in order): codes and absmax
// concatenated. Each expert has its own nested offset, so double-quantised absmax are first dequantised to
// fp32 — exactly the values bitsandbytes computes from them — and the result holds plain fp32 absmax.
ops::WeightTensor concat_nf4(const std::vector<ops::WeightTensor>& parts, const std::vector<int64_t>& shape,
                             const std::string& what);

}  // namespace ax::models
