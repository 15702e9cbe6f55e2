// Fine-grained FP8 checkpoints (DeepSeek-V3 / R1, Kimi K2, GLM-4.5 / 4.6 "-FP8", Qwen3 "-FP8"): config.json's
// quantization_config {quant_method: "fp8", weight_block_size: [bm, bn], activation_scheme: "dynamic", fmt: "e4m3"}
// and, per quantised Linear, `X.weight` stored float8_e4m3fn with `X.weight_scale_inv` fp32
// [ceil(rows/bm), ceil(cols/bn)] (one scale per bm x bn block; a fused expert tensor [E, rows, cols] has [E, ...]).
// They load dequantised: weight = fp8 value (as fp32) x its block's scale, computed in fp32 and cast to the
// compute dtype, as transformers 5.23's Fp8Dequantize (integrations/finegrained_fp8.py) does on a CPU or an older
// GPU. The tensors themselves say what is quantised (an fp8 weight with its scale); the rest reads as usual.
// Untrusted input: a malformed config, a missing scale, a scale of another shape or dtype are UsageErrors naming
// the key or the file and tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/safetensors.hpp"
#include "models/fp8_config.hpp"

namespace ax::models {

// Whether tensor `key` is stored in an FP8 dtype (e4m3fn or e5m2) or has a `_scale_inv` beside it.
bool fp8_stored(const safetensors::Checkpoint& ckpt, const std::string& key);
// The scale tensor's name: "X.weight" -> "X.weight_scale_inv".
std::string fp8_scale_key(const std::string& key);

// FP8 weight `key` (its header already checked against `shape`) and its scale, against the config: a UsageError
// naming the file and tensor when the config has no fp8 quantization_config, the weight is not e4m3fn, the scale
// is missing, not fp32 / bf16, or not of the block grid's shape.
void check_fp8_weight(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                      const std::string& key);

// The dequantised values of `w` (float8 [..., rows, cols]) with scales `scale_inv` ([..., ceil(rows/bm),
// ceil(cols/bn)]): fp32. Ragged edge blocks (rows or cols not a multiple of the block) use their block's scale,
// as DeepSeek's weight_dequant and transformers' _dequantize_fp8_weight do.
at::Tensor fp8_dequantize(const at::Tensor& w, const at::Tensor& scale_inv, int64_t block_rows, int64_t block_cols);

// check_fp8_weight, then the weight read and dequantised (fp32, on the CPU).
at::Tensor read_fp8_dequantized(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                                const std::string& key);

}  // namespace ax::models
