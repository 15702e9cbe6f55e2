// A decoder checkpoint against its config.json, from the safetensors headers only: which tensors the model
// holds (in transformers 5 naming), where load reads each from (fused or per-expert keys, bitsandbytes- or
// MXFP4-packed), and the check that every one is there with the dtype and shape the config implies. The load
// (DecoderModel's constructor) and the pre-flight check (`validate`, `run` before it loads: ModelFamilyCheck)
// both go through here, so they refuse the same checkpoints with the same messages, before anything is
// allocated for the model's sizes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "axengine/ops/quant_formats.hpp"
#include "axengine/safetensors.hpp"
#include "models/hf_config.hpp"
#include "models/weight_policy.hpp"

namespace ax::models {

using TensorShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// The checkpoint as the decoder reads it: for a multimodal checkpoint's text part (HfConfig::text_part) the
// language model's tensors under model.* (model.language_model.* renamed) and lm_head; the rest (the vision tower
// model.visual.*, an MTP head) left out: `left_out`, when given, gets their count.
safetensors::Checkpoint checkpoint_text_view(const HfConfig& c, const safetensors::Checkpoint& ckpt, int64_t* left_out = nullptr);

// The weights in transformers 5 naming (fused experts), with shapes, layer by layer.
TensorShapes internal_tensors(const HfConfig& c);
// Whether internal tensor `name` stays fp32 in any compute dtype, as transformers keeps it
// (_keep_in_fp32_modules_strict): the group router's correction bias, whose small differences between experts
// would round away in bf16.
bool keeps_fp32(const std::string& name);
// The HF checkpoint keys a config expects in the layout HF save_pretrained writes, with shapes (for
// init-model and inspect).
TensorShapes expected_checkpoint_tensors(const HfConfig& cfg);

// Qwen3-VL-MoE (models/qwen3_vl.hpp; the one multimodal-RoPE decoder with experts): the hub's checkpoints hold the
// fused experts transposed, gate_up_proj [E, H, 2I] and down_proj [E, I, H], save_pretrained writes them as the
// module holds them ([E, 2I, H], [E, H, I]); transformers' conversion for qwen3_vl_moe (Transpose with check_dims)
// transposes a stored tensor unless it already has the module's shape. Both layouts load (and per-expert tensors,
// as for qwen3_moe); merge-lora writes the hub's (models/decoder_merge.cpp).
bool experts_maybe_transposed(const HfConfig& c);

// Per-expert key names as transformers save_pretrained writes them (the reverse of its conversion mapping).
struct ExpertKeys {
  std::string router, gate, up, down;  // with {e} left for the expert index
};
ExpertKeys expert_keys(const HfConfig& c, const std::string& layer_prefix, bool block_sparse);
std::string with_expert(std::string pattern, int64_t e);

// Where load reads internal tensor `name` (of internal shape `shape`) from.
struct TensorSource {
  // The checkpoint keys with the shape each has there: one key, or per-expert keys in the order load stacks
  // them (gate, up of expert 0, gate, up of expert 1, ... for gate_up_proj; down of each expert for down_proj).
  TensorShapes keys;
  bool per_expert = false;
  bool bnb = false;         // stored packed by bitsandbytes (a quant state beside the key): nf4
  bool mxfp4 = false;       // gpt_oss experts stored as <name>_blocks / <name>_scales (keys holds <name>)
  bool transposed = false;  // gpt_oss expert matrices: the checkpoint holds the transpose (gpt_oss.hpp)
};
TensorSource tensor_source(const HfConfig& c, const safetensors::Checkpoint& ckpt, const std::string& name,
                           const std::vector<int64_t>& shape);

// Plain tensor `key` against the shape the config implies: present, not packed without a quantization_config
// that says so, of that shape, floating point. UsageError naming the file and the tensor.
void check_tensor_header(const HfConfig& c, const safetensors::Checkpoint& ckpt, const std::string& key,
                         const std::vector<int64_t>& shape);

// The sizes that drive every loop over the model (layers, vocabulary, hidden size, heads × head_dim, experts)
// against the checkpoint: a UsageError naming the config key when they disagree. Reads the list of names and
// a few headers; allocates nothing for the config's sizes, so a config claiming 10^9 layers or experts is
// refused at once (inspect runs this before it lists the model's tensors).
void check_checkpoint_sizes(const HfConfig& c, const safetensors::Checkpoint& ckpt);

// check_checkpoint_sizes, then every tensor the model holds, from the headers: what the load would refuse, with
// its messages, without reading a weight.
void check_checkpoint(const HfConfig& c, const safetensors::Checkpoint& ckpt);

// The weight plan of `policy` for this model (WeightPlan: skip_modules must name its modules), checked against
// a pre-quantised checkpoint's quantization_config (weight_format unset or nf4 with matching keys).
WeightPlan weight_plan(const HfConfig& c, const WeightPolicy& policy);

// weight_format = "fp8": why projection `name` (read from `s`) is not held as stored in FP8 but dequantised at load
// (lm_head, skip_modules, not FP8 in the checkpoint, per-expert pieces off the block grid), or "" when it is.
std::string fp8_kept_why(const HfConfig& c, const safetensors::Checkpoint& ckpt, const WeightPlan& plan, const std::string& name,
                         const TensorSource& s);

// The format load holds each frozen projection in (keyed by internal name: ...q_proj.weight,
// ...mlp.experts.gate_up_proj, lm_head.weight), from the headers and the weight plan: a packed checkpoint
// tensor (bitsandbytes nf4, gpt_oss's MXFP4 experts) stays packed unless skip_modules names it (lm_head is
// always dense); a dense one is packed into the plan's format where the plan admits it.
std::map<std::string, ops::WeightFormat> held_formats(const HfConfig& c, const WeightPlan& plan,
                                                      const safetensors::Checkpoint& ckpt);

}  // namespace ax::models
