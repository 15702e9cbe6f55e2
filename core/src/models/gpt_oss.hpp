// gpt_oss's pieces of the decoder (models/gpt_oss_moe.cpp): its MoE tensors and their checkpoint layout.
//
// transformers' GptOssExperts stores gate_up_proj [E, H, 2I] and down_proj [E, I, H] (x · W, "transposed"),
// gate and up interleaved along 2I (gate = columns 0, 2, 4, …; up = 1, 3, 5, …). moe.experts takes the
// ENK layout the other families use ([E, N, K]), so the load transposes the last two dims (here, once) and
// keeps the interleaving: row n of the internal gate_up_proj is column n of the checkpoint's.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"
#include "axengine/safetensors.hpp"
#include "models/hf_config.hpp"

namespace ax::models {

// The MoE tensors of layer prefix `p` ("model.layers.3.") in the model's own layout, with shapes.
void gpt_oss_moe_tensors(const HfConfig& c, const std::string& p, std::vector<std::pair<std::string, std::vector<int64_t>>>& out);
// True for the expert matrices whose checkpoint layout is the transpose of ours.
bool gpt_oss_transposed(const std::string& name);
// The checkpoint shape of an internal tensor (the last two dims swapped where gpt_oss_transposed).
std::vector<int64_t> gpt_oss_checkpoint_shape(const std::string& name, std::vector<int64_t> shape);
// Checkpoint layout → ours, and back (a transpose of the last two dims where gpt_oss_transposed), contiguous.
at::Tensor gpt_oss_from_checkpoint(const std::string& name, const at::Tensor& t);
at::Tensor gpt_oss_to_checkpoint(const std::string& name, const at::Tensor& t);

// MXFP4 experts as the gpt-oss checkpoints store them (transformers' integrations/mxfp4.py):
//   <name>_blocks uint8 [E, N, K/32, 16]: block g of row n holds elements 32g … 32g+31 of that row, two per
//                 byte, the first in the LOW nibble (E2M1 codes, the FP4_VALUES order);
//   <name>_scales uint8 [E, N, K/32]: E8M0 exponents, value = E2M1 · 2^(scale − 127).
// transformers dequantises to [E, N, K] and transposes to its dense [E, K, N], so the packed tensors are
// already in our ENK layout with blocks along K: exactly ops::WeightTensor's mxfp4 (axis 2, first element
// in the low nibble). The codes are only reshaped to [E, N, K/2], never decoded. Shapes that disagree with
// the config are a UsageError naming the tensor; check_gpt_oss_mxfp4 is that check alone (the headers).
void check_gpt_oss_mxfp4(const safetensors::Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
                         const std::string& source);
ops::WeightTensor read_gpt_oss_mxfp4(const safetensors::Checkpoint& ckpt, const std::string& name,
                                     const std::vector<int64_t>& shape, const std::string& source);

}  // namespace ax::models
