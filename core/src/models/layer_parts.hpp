// A decoder layer as an assembly of parts, chosen once per layer from the config (assemble_layers): the residual
// norms, a token mixer (attention, multi-head latent attention or a Gated DeltaNet), a feed-forward part (a dense
// MLP or one of the MoE blocks) and, beside a MoE block, a shared expert. Each part is one description of
// everything the model does with it: the tensors it holds, where LoRA can go in it, the kernel calls it makes
// and the DecoderModel member that runs it. The load (internal_tensors), LoRA (lora_sites), the ops plan
// (decoder_calls: validate, `plugins explain`, kernels.strict), the decode cache and the forward all walk the
// same assembly, so none of them tests the config's kinds again, and they cannot disagree about a layer.
//
// The parts: parts/attention.cpp, parts/mla_layer.cpp, parts/gated_deltanet.cpp (mixers); parts/dense_mlp.cpp,
// parts/moe_block.cpp, gpt_oss_moe.cpp, parts/group_moe_block.cpp, parts/shared_expert.cpp (feed-forward);
// decoder_layer.cpp (the norms and the layer's residual arrangement: Parts::prenorm, Parts::sandwich).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/model_check.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/hf_config.hpp"
#include "models/lora.hpp"

namespace ax::models {

class DecoderModel;
struct LayerParts;

// What every part of a layer's forward reads beside its input: the RoPE positions (int64 [T], or [3, T] for
// multimodal RoPE), the samples' bounds and longest sample, and the layer's rotary frequencies.
struct LayerInputs {
  at::Tensor pos, cu;
  int64_t max_len = 0;
  at::Tensor inv_freq;
};

using HeldFormats = std::map<std::string, ops::WeightFormat>;

// The facets every part has, each under the layer's prefix ("model.layers.i."): its tensors (internal names and
// shapes, in load order), its LoRA sites (peft's module names) and the kernel calls it makes with the
// projections held in `formats` (decoder_calls).
struct PartFacets {
  const char* name;  // for messages and tests: "attention", "mla", "moe_softmax_topk", ...
  void (*tensors)(const HfConfig& c, const std::string& prefix, TensorShapes& out);
  void (*lora_sites)(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out);
  void (*calls)(const HfConfig& c, const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out);
};

// What decode keeps per layer for a mixer: key/value entries [batch, capacity, ...] (attention; MLA's latent and
// rope key), or a linear-attention layer's conv window [batch, W-1, C] and fp32 recurrent state. Empty: none.
struct MixerCache {
  std::vector<int64_t> k, v, conv, state;
};

// A token mixer: x (the normed hidden states [T, H]) -> [T, H].
struct MixerPart : PartFacets {
  at::Tensor (DecoderModel::*forward)(int64_t layer, const at::Tensor& x, const LayerInputs& in);
  MixerCache (*cache)(const HfConfig& c, int64_t batch, int64_t capacity);
};

// A feed-forward part: x [T, H] -> [T, H]; a MoE block appends its router logits (the aux loss), if any.
struct FfnPart : PartFacets {
  at::Tensor (DecoderModel::*forward)(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);
  bool moe;  // routed experts (tiled_mlp then dequantises packed experts once per pass: ExpertWeightCache)
};

// The layer's norms and how the mixer and the feed-forward parts join the residual stream (`forward` runs the
// whole layer). Its tensors come in two runs, as transformers' modules list them: `tensors` before the mixer's,
// `ffn_tensors` after them (before the feed-forward part's).
struct NormsPart : PartFacets {
  void (*ffn_tensors)(const HfConfig& c, const std::string& prefix, TensorShapes& out);
  at::Tensor (DecoderModel::*forward)(int64_t layer, const LayerParts& parts, const at::Tensor& h, const LayerInputs& in,
                                      std::vector<at::Tensor>& router_logits);
};

// One layer's parts.
struct LayerParts {
  const NormsPart* norms = nullptr;
  const MixerPart* mixer = nullptr;
  const FfnPart* ffn = nullptr;
  const FfnPart* shared_expert = nullptr;  // beside a MoE block (Qwen3.5-MoE, Qwen3-Next, DeepSeek-V3, GLM-4.5); or none
  bool local_rope = false;                 // rotates with the config's rope_local (gemma3_text's sliding layers)
};

// Every part there is, each defined in its own file (see the top). A friend of DecoderModel: a part names the
// private member that runs it.
struct Parts {
  static const NormsPart& prenorm();   // input_layernorm -> mixer -> + h -> post_attention_layernorm -> ffn -> + x
  static const NormsPart& sandwich();  // gemma3_text: the mixer's and the ffn's outputs normed again, a pre-ffn norm
  static const MixerPart& attention();
  static const MixerPart& mla();
  static const MixerPart& gated_deltanet();
  static const FfnPart& swiglu_mlp();
  static const FfnPart& gelu_mlp();
  static const FfnPart& moe_softmax_topk();
  static const FfnPart& moe_gpt_oss();
  static const FfnPart& moe_group_topk();
  static const FfnPart& shared_expert();
};

// The parts of every layer of `c`: the one place the config's kinds (linear-attention layers, MLA, MoE layers and
// MoeKind, the MLP's activation, sandwich norms, shared experts, local RoPE) choose the layer's structure.
std::vector<LayerParts> assemble_layers(const HfConfig& c);

// The facets of a whole layer, part by part in forward order (norms, mixer, feed-forward, shared expert).
void layer_tensors(const HfConfig& c, const LayerParts& l, const std::string& prefix, TensorShapes& out);
void layer_lora_sites(const HfConfig& c, const LayerParts& l, const std::string& prefix, std::vector<LoraSite>& out);
void layer_calls(const HfConfig& c, const LayerParts& l, const std::string& prefix, const HeldFormats& formats,
                 std::vector<OpCall>& out);

std::string layer_prefix(int64_t i);  // "model.layers.i."

}  // namespace ax::models
