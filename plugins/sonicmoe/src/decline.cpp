// sonicmoe's run-time decline (docs/ops/moe.mlp.md "Run-time decline"): what the kernels' tiles and
// formats cannot take. Selection already keeps it off other GPUs, dtypes and quantised formats by its
// requirements (the descriptor in sonicmoe_plugin.cpp); this catches the calls inside those that still do
// not fit: a K dimension that is no multiple of the 64-wide K tile, a LoRA rank past one K tile, a
// quantised weight paired with a dense one.
#include <limits>

#include <axengine/strings.hpp>

#include "../kernels/gather_gemm.hpp"
#include "sonicmoe.hpp"

namespace ax::sonicmoe {

std::optional<std::string> decline_reason(const ops::MoeMlpArgs& a) {
  if (a.x.scalar_type() != at::kBFloat16) return str("dtype ", c10::toString(a.x.scalar_type()), " (bf16 only)");
  for (const auto* w : {&a.gate_up, &a.down}) {
    if (!w->is_dense())
      return str(w == &a.gate_up ? "gate_up" : "down", " is ", ops::to_string(w->format),
                 " (dense weights only: the kernels load bf16 tiles by TMA)");
    if (w->values.scalar_type() != a.x.scalar_type()) return str(w == &a.gate_up ? "gate_up" : "down", " dtype differs from x");
  }
  const ops::MoeMlpDims d = ops::moe_mlp_dims(a);
  if (d.H % 64 != 0) return str("H = ", d.H, " is not a multiple of 64 (the K tile)");
  if (d.I % 64 != 0) return str("I = ", d.I, " is not a multiple of 64 (the K tile)");
  for (const auto* l : {&a.gate_up_lora, &a.down_lora}) {
    if (!l->defined()) continue;
    const int64_t r = l->a.size(0) / d.E;
    if (r > 64) return str(l == &a.gate_up_lora ? "gate_up" : "down", " LoRA rank ", r, " > 64 (one K tile)");
  }
  // Row indices are 32-bit in the kernels' tile schedule.
  if (d.M >= (int64_t{1} << 31) || d.E * 2 * d.I >= (int64_t{1} << 31) || d.E * d.H >= (int64_t{1} << 31))
    return str("M = ", d.M, " or a weight's row count is past 2^31");
  if (d.E > kGatherGemmMaxExperts)
    return str("E = ", d.E, " > ", kGatherGemmMaxExperts, " (the tile table lives in shared memory)");
  return std::nullopt;
}

}  // namespace ax::sonicmoe
