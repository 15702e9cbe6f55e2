// The kernel calls of a DecoderModel, derived from its assembled layers (models/layer_parts.hpp: each part says
// which calls its forward makes): the one list the constructor resolves (a missing backend fails the load) and
// `validate`, `plugins explain` and kernels.strict check (ModelCheck::ops). The forward runs the same parts, so
// the list cannot drift from what it calls; tests/unit/model_op_plan_test.cpp records every call of a training step and
// a logits forward of each family and compares.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "axengine/model_check.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/safetensors.hpp"
#include "models/hf_config.hpp"
#include "models/weight_policy.hpp"

namespace ax::models {

// The attention op's layout: "sinks" with per-head sinks (gpt_oss; only backends claiming it qualify), else "".
std::string attention_layout(const HfConfig& c);
// Whether the loss runs through linear_ce (the LM head and the loss in one op) when only the loss is asked for:
// lm_head is a dense frozen weight without LoRA or bias. Otherwise the logits are made (linear.lora) and the
// loss is ATen's cross_entropy.
bool fused_loss_applies(ops::WeightFormat lm_head_format, bool lm_head_lora, bool lm_head_bias);

// Every (op, weight format, layout) a DecoderModel of `c` calls — forward and backward of a training step
// (loss only) and a forward for logits (generation, exact_match) — with its frozen projections held in
// `formats` (held_formats: by internal name, lm_head.weight included). In known_ops() order, each once.
std::vector<OpCall> decoder_calls(const HfConfig& c, const std::map<std::string, ops::WeightFormat>& formats);

// The format the load packs the base into with a quantizer ("" = none: dense, or a pre-quantised checkpoint
// taken as stored). Projections the plan keeps dense (skip_modules, misfits) do not change it: the quantizer is
// resolved at load whatever it ends up packing.
std::string quantize_format(const HfConfig& c, const WeightPlan& plan);

// The pre-flight side of a DecoderModel: the checkpoint against the config (check_checkpoint), the weight plan
// of `policy`, and from those the calls (decoder_calls with held_formats) and the quantizer the load will
// resolve. What DecoderModel's constructor checks and resolves, without reading a weight.
struct DecoderPlan {
  std::vector<OpCall> calls;
  std::string quantize;
};
DecoderPlan plan_decoder(const HfConfig& c, const safetensors::Checkpoint& ckpt, const WeightPolicy& policy);

// `calls` in known_ops() order (the order `plugins explain` lists ops in), each once.
std::vector<OpCall> ordered_calls(std::vector<OpCall> calls);

}  // namespace ax::models
