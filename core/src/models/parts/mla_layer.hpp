// Multi-head latent attention as a decoder layer's mixer (deepseek_v3: HfConfig::is_mla): its tensors, LoRA sites
// and op calls under self_attn., and its options from the config: the layer part Parts::mla()
// (models/layer_parts.hpp). The math is models/parts/mla.hpp's; the forward is DecoderModel::mla_block.
//
//   self_attn.q_a_proj [q_lora_rank, H] (+ bias), q_a_layernorm [q_lora_rank], q_b_proj [Hq·(nope+rope), q_lora_rank]
//     or q_proj [Hq·(nope+rope), H] when q_lora_rank is null
//   self_attn.kv_a_proj_with_mqa [kv_lora_rank + rope, H] (+ bias), kv_a_layernorm [kv_lora_rank],
//   self_attn.kv_b_proj [Hq·(nope + v), kv_lora_rank], self_attn.o_proj [H, Hq·v] (+ bias)
// (biases where attention_bias is set, as DeepseekV3Attention builds them).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "axengine/model_check.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/hf_config.hpp"
#include "models/lora.hpp"
#include "models/parts/mla.hpp"

namespace ax::models {

MlaOptions mla_options(const HfConfig& c);
void mla_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out);
// q_a_proj, q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj: peft's module names.
void mla_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out);
void mla_calls(const HfConfig& c, const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
               std::vector<OpCall>& out);
// The latent sizes against the first layer's tensors (check_checkpoint_sizes): a UsageError naming the config key
// (q_lora_rank null or not, kv_lora_rank, qk_rope_head_dim) when the checkpoint disagrees.
void check_mla_sizes(const HfConfig& c, const safetensors::Checkpoint& ckpt);
// The projections of the mixer (module names under self_attn.), in the order above.
std::vector<std::string> mla_projections(const HfConfig& c);

}  // namespace ax::models
