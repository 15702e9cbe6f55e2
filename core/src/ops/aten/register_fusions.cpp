// The `aten` backends of rms_norm, swiglu and linear_ce: production paths in plain ATen (compute dtype,
// few kernels, linear_ce chunked over tokens) for bf16 and fp16 on CPU and CUDA. fp32 stays with
// `reference`, which is transformers' fp32 math exactly. Registered like a plugin's kernels, origin builtin.
#include "ops/aten/register_fusions.hpp"

#include <memory>

namespace ax::ops {

void register_aten_fusion_kernels(Registry& registry) {
  auto add = [&](const char* op, std::shared_ptr<void> object, const char* summary) {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = op;
    p.info.name = "aten";
    p.info.graph_safe = true;  // no host sync, nothing read at capture time (conformance cuda_graph check)
    p.info.needs.devices = {"cpu", "cuda"};
    p.info.needs.dtypes = {"bf16", "fp16"};
    p.info.summary = summary;
    p.object = std::move(object);
    registry.add(std::move(p));
  };
  add(RmsNorm::kOp, std::shared_ptr<RmsNorm>(make_aten_rms_norm()),
      "ATen ops in the compute dtype, fp32 statistics (about 8 kernels forward)");
  add(Swiglu::kOp, std::shared_ptr<Swiglu>(make_aten_swiglu()), "ATen: fp32 silu, product rounded on store (3 kernels)");
  add(LinearCe::kOp, std::shared_ptr<LinearCe>(make_aten_linear_ce(kAtenLinearCeChunkBytes)),
      "ATen, chunked over tokens (chunk logits <= 256 MiB fp32): the [T, V] logits never exist whole");
}

}  // namespace ax::ops
