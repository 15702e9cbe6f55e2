#include "ops/reference/register.hpp"

#include <memory>

#include "axengine/ops/attention.hpp"
#include "axengine/ops/dequant.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/quantizer.hpp"

namespace ax::ops {

// Defined in the reference/*.cpp of each op.
std::shared_ptr<MoeExperts> make_reference_moe_experts();
std::shared_ptr<Dequant> make_reference_dequant();
std::shared_ptr<NormRope> make_reference_norm_rope();
std::shared_ptr<Attention> make_reference_attention();
std::shared_ptr<LinearLora> make_reference_linear_lora();
std::shared_ptr<Quantizer> make_reference_quantizer();  // ops/quant/quantizer.cpp

namespace {
void add(Registry& registry, const char* op, std::shared_ptr<void> object, std::vector<std::string> formats,
         std::vector<std::string> layouts, const char* summary) {
  Provider p;
  p.info.kind = ProviderKind::kernel;
  p.info.op = op;
  p.info.name = "reference";
  p.info.needs.devices = {"cpu", "cuda"};
  p.info.needs.dtypes = {"fp32", "bf16", "fp16"};
  p.info.needs.formats = std::move(formats);
  p.info.needs.layouts = std::move(layouts);
  p.info.plugin = "builtin";
  p.info.origin = "builtin";
  p.info.summary = summary;
  p.object = std::move(object);
  registry.add(std::move(p));
}
}  // namespace

void register_reference_kernels(Registry& registry) {
  add(registry, MoeExperts::kOp, make_reference_moe_experts(), {"dense", "nf4", "mxfp4", "nvfp4"}, {"EKN", "ENK"},
      "plain ATen: per-expert matmuls on selectively dequantised weights, fp32 accumulation");
  add(registry, Dequant::kOp, make_reference_dequant(), {"nf4", "mxfp4", "nvfp4"}, {},
      "plain ATen table look-ups and scales");
  add(registry, NormRope::kOp, make_reference_norm_rope(), {}, {}, "plain ATen, fp32 math");
  add(registry, Attention::kOp, make_reference_attention(), {}, {},
      "plain ATen: per-sequence softmax(q k^T) v, fp32 math (memory O(L^2) per sequence)");
  add(registry, LinearLora::kOp, make_reference_linear_lora(), {"dense", "nf4", "mxfp4", "nvfp4"}, {},
      "plain ATen, fp32 math, never forms B·A; a packed W is dequantised inside each call, never kept");

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
