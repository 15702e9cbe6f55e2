// Fine-grained FP8 checkpoints (DeepSeek-V3 / R1, Kimi K2, GLM-4.5 / 4.6 "-FP8", Qwen3 "-FP8"): config.json's
// quantization_config {quant_method: "fp8", weight_block_size: [bm, bn], activation_scheme: "dynamic", fmt: "e4m3"}
// and, per quantised Linear, `X.weight` stored float8_e4m3fn with `X.weight_scale_inv` fp32
// [ceil(rows/bm), ceil(cols/bn)] (one scale per bm x bn block; a fused expert tensor [E, rows, cols] has [E, ...]).
// By default they load dequantised: weight = fp8 value (as fp32) x its block's scale, computed in fp32 and cast to
// the compute dtype, as transformers 5.23's Fp8Dequantize (integrations/finegrained_fp8.py) does on a CPU or an
// older GPU. With [model] weight_format = "fp8" the projections stay as stored instead (ops::WeightFormat::fp8:
// the e4m3 bytes and the fp32 scales), and the ops decode them on use with exactly that arithmetic, so the model
// computes the same numbers at half the memory. The tensors themselves say what is quantised (an fp8 weight with
// its scale); the rest reads as usual.
// Untrusted input: a malformed config, a missing scale, a scale of another shape or dtype are UsageErrors naming
// the key or the file and tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"
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

// The weight `w` (float8_e4m3fn [..., rows, cols]) with scales `scale_inv` ([..., ceil(rows/bm), ceil(cols/bn)],
// fp32 or bf16: exact in fp32) as an fp8 WeightTensor, on w's device.
ops::WeightTensor fp8_weight(const at::Tensor& w, const at::Tensor& scale_inv, int64_t block_rows, int64_t block_cols);

// The dequantised values of `w` with scales `scale_inv` (as fp8_weight takes them): fp32, by ops::dequantize,
// the decode the ops run on a packed weight. Ragged edge blocks (rows or cols not a multiple of the block) use
// their block's scale, as DeepSeek's weight_dequant and transformers' _dequantize_fp8_weight do.
at::Tensor fp8_dequantize(const at::Tensor& w, const at::Tensor& scale_inv, int64_t block_rows, int64_t block_cols);

// check_fp8_weight, then the weight read and dequantised (fp32, on the CPU).
at::Tensor read_fp8_dequantized(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                                const std::string& key);
// check_fp8_weight, then the weight read as stored (an fp8 WeightTensor on the CPU).
ops::WeightTensor read_fp8_packed(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                                  const std::string& key);

// Why the projection made of checkpoint keys `keys` ([E x per] per-expert keys stacked on a new dim 0, `per` of them
// concatenated along rows per expert; or one key) cannot be held as one fp8 weight, or "" when it can: a key not
// stored in FP8, or pieces of an expert whose rows are not whole blocks (the fused grid would mix two pieces in
// one block: gate_proj and up_proj of an odd intermediate size).
std::string fp8_unpackable(const Fp8Config& c, const safetensors::Checkpoint& ckpt,
                           const std::vector<std::pair<std::string, std::vector<int64_t>>>& keys, int64_t per);

// Per-expert fp8 weights as one: `parts` holds E x per weights (expert-major), each expert's `per` pieces
// concatenated along rows, the experts stacked on a new dim 0: codes and scales alike, nothing decoded.
// fp8_unpackable must have said "" for them.
ops::WeightTensor stack_fp8_experts(const std::vector<ops::WeightTensor>& parts, int64_t per);

}  // namespace ax::models
