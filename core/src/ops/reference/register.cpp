// Core's ops as registered data: one OpSpec each (axengine/op_spec.hpp), registered through the same
// PluginRegistrar::op a plugin uses. The registry adds each op's `reference` backend with it.
#include "ops/reference/register.hpp"

#include <memory>

#include "axengine/conformance.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/op_conformance.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/dequant.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_ce.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"
#include "axengine/plugin.hpp"
#include "conformance/harness.hpp"
#include "axengine/ops/quantizer.hpp"

namespace ax::ops {

// Defined in the reference/*.cpp of each op.
std::shared_ptr<MoeExperts> make_reference_moe_experts();
std::shared_ptr<Dequant> make_reference_dequant();
std::shared_ptr<NormRope> make_reference_norm_rope();
std::shared_ptr<Attention> make_reference_attention();
std::shared_ptr<LinearLora> make_reference_linear_lora();
std::shared_ptr<RmsNorm> make_reference_rms_norm();
std::shared_ptr<Swiglu> make_reference_swiglu();
std::shared_ptr<LinearCe> make_reference_linear_ce();
std::shared_ptr<Quantizer> make_reference_quantizer();
std::shared_ptr<MoeMlp> make_reference_moe_mlp();  // reference/moe_mlp.cpp  // ops/quant/quantizer.cpp
std::shared_ptr<LinearAttention> make_reference_linear_attention();
std::shared_ptr<CausalConv1d> make_reference_causal_conv1d();

namespace {

namespace cd = conformance::detail;

enum class SpecRows { plain, attention, dequant };

// The spec of one of core's ops: id, key and summary from known_ops(); tolerances from the policy table
// (conformance::kTolerances, docs/ops/README.md), picking the op's columns.
OpSpec spec(const char* id, std::vector<std::string> formats, std::vector<std::string> layouts, SpecRows rows,
            const char* reference_summary, std::function<void(conformance::Suite&)> problems) {
  const OpInfo* info = find_op(id);
  OpSpec s;
  s.id = info->id;
  s.config_key = info->config_key;
  s.summary = info->summary;
  s.dtypes = {"fp32", "bf16", "fp16"};
  s.formats = std::move(formats);
  s.layouts = std::move(layouts);
  for (const auto& t : conformance::kTolerances) {
    const double fwd = rows == SpecRows::dequant ? t.dequant : t.forward;
    const double bwd = rows == SpecRows::attention ? t.attention_backward : t.backward;
    s.tolerances.push_back({t.dtype, fwd, bwd});
  }
  s.reference_summary = reference_summary;
  s.conformance = std::move(problems);
  return s;
}

}  // namespace

void register_reference_kernels(Registry& registry) {
  PluginRegistrar reg;
  reg.op<MoeExperts>(spec(MoeExperts::kOp, {"dense", "nf4", "mxfp4", "nvfp4", "fp8"}, {"EKN", "ENK"}, SpecRows::plain,
                          "plain ATen: per-expert matmuls on selectively dequantised weights, fp32 accumulation",
                          cd::moe_experts_problems),
                     make_reference_moe_experts());
  reg.op<Dequant>(spec(Dequant::kOp, {"nf4", "mxfp4", "nvfp4", "fp8"}, {}, SpecRows::dequant,
                       "plain ATen table look-ups and scales", cd::dequant_problems),
                  make_reference_dequant());
  reg.op<NormRope>(spec(NormRope::kOp, {}, {}, SpecRows::plain, "plain ATen, fp32 math", cd::norm_rope_problems),
                   make_reference_norm_rope());
  // Layouts are the op's variants: "plain", and "sinks" (per-head sink logits; gpt_oss). A backend that
  // lists layouts without "sinks" is never selected for a call with sinks; one that lists none claims both
  // and the conformance suite holds it to the sink cases.
  reg.op<Attention>(spec(Attention::kOp, {}, {"plain", "sinks"}, SpecRows::attention,
                         "plain ATen: per-sequence softmax(q k^T) v, fp32 math (memory O(L^2) per sequence)",
                         cd::attention_problems),
                    make_reference_attention());
  reg.op<LinearLora>(spec(LinearLora::kOp, {"dense", "nf4", "mxfp4", "nvfp4", "fp8"}, {}, SpecRows::plain,
                          "plain ATen, fp32 math, never forms B·A; a packed W is dequantised inside each call, never kept",
                          cd::linear_lora_problems),
                     make_reference_linear_lora());
  reg.op<RmsNorm>(spec(RmsNorm::kOp, {}, {}, SpecRows::plain,
                       "plain ATen, fp32 statistics, transformers' rounding points (s, n and y rounded)",
                       cd::rms_norm_problems),
                  make_reference_rms_norm());
  reg.op<Swiglu>(spec(Swiglu::kOp, {}, {}, SpecRows::plain, "plain ATen, fp32 math, rounded once", cd::swiglu_problems),
                 make_reference_swiglu());
  reg.op<LinearCe>(spec(LinearCe::kOp, {}, {}, SpecRows::plain,
                        "plain ATen: the whole [T, V] logits (rounded to the compute dtype), fp32 log-softmax",
                        cd::linear_ce_problems),
                   make_reference_linear_ce());
  reg.op<MoeMlp>(spec(MoeMlp::kOp, {"dense", "nf4", "mxfp4", "nvfp4", "fp8"}, {"EKN", "ENK"}, SpecRows::plain,
                      "composed: two reference moe.experts calls and the GLU between them in fp32",
                      cd::moe_mlp_problems),
                 make_reference_moe_mlp());
  reg.op<LinearAttention>(spec(LinearAttention::kOp, {}, {}, SpecRows::plain,
                               "the recurrence itself, row by row, fp32 math and state (host loop over the sequences)",
                               cd::linear_attention_problems),
                          make_reference_linear_attention());
  reg.op<CausalConv1d>(spec(CausalConv1d::kOp, {}, {}, SpecRows::plain,
                            "plain ATen per sequence, fp32 math, rounded once", cd::causal_conv1d_problems),
                       make_reference_causal_conv1d());
  for (const auto& s : reg.staged()) {
    Provider p;
    p.info.kind = s.kind;
    p.info.op = s.op;
    p.info.name = s.name;
    p.object = s.object;
    registry.add(std::move(p));  // plugin and origin: "builtin"
  }

  Provider q;  // packs the frozen base at load ([model] weight_format)
  q.info.kind = ProviderKind::quantizer;
  q.info.name = "reference";
  q.info.needs.devices = {"cpu", "cuda"};
  q.info.needs.formats = {"nf4", "mxfp4", "nvfp4"};
  q.info.summary = "plain ATen: bitsandbytes nf4 (incl. double quant), torchao mxfp4 / nvfp4, bit for bit";
  q.object = make_reference_quantizer();
  registry.add(std::move(q));
}

}  // namespace ax::ops
