// The Gated DeltaNet mixer (the linear-attention layers of Qwen3.5 and Qwen3-Next; transformers 5.23's
// Qwen3_5GatedDeltaNet): its tensors, LoRA sites and op calls, the layer part Parts::gated_deltanet()
// (models/layer_parts.hpp). Its forward is DecoderModel::gated_deltanet_block, per layer HfConfig::is_linear_layer marks:
//   qkv = in_proj_qkv(x) → causal_conv1d (kernel linear_conv_kernel_dim, SiLU; the window restarts at each sample)
//   → q, k [T, Hk, Dk], v [T, Hv, Dv];  β = sigmoid(in_proj_b(x));  g = −exp(A_log)·softplus(in_proj_a(x) + dt_bias)
//   o = linear_attention(q, k, v, g, β; q and k L2-normalised, scale Dk^−½; the state restarts at each sample)
//   out_proj(RMSNorm(o over Dv, weight norm.weight, no 1 + w) · silu(in_proj_z(x)))
// Qwen3-Next (HfConfig::gdn.fused) holds in_proj_qkvz and in_proj_ba instead, their rows grouped per key head; the
// block regroups their outputs into the qkv, z, b and a above.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "axengine/model_check.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/hf_config.hpp"
#include "models/lora.hpp"

namespace ax::models {

// The mixer's tensors under `prefix` ("model.layers.i."), in internal (= checkpoint) names and shapes.
void gated_deltanet_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out);
// Its LoRA sites: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (or in_proj_qkvz, in_proj_ba), out_proj (peft's names).
void gated_deltanet_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out);
// Its kernel calls with the projections held in `formats` (decoder_calls).
void gated_deltanet_calls(const HfConfig& c, const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
                          std::vector<OpCall>& out);

}  // namespace ax::models
