// The routed experts of every MoE part (parts/routed_experts.hpp) as one moe.mlp call: the part builds the
// routing and gates (its router's), this fills in the fused expert weights, their LoRA and the backend.
// LoRA dropout does not apply to the experts (as before moe.mlp: the op has no dropout).
#include <algorithm>
#include <tuple>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "models/expert_parallel.hpp"
#include "models/parts/routed_experts.hpp"
#include "models/tiled_mlp.hpp"

namespace ax::models {

void routed_experts_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  out.push_back({prefix + "mlp.experts.gate_up_proj", {E, 2 * I, H}});
  out.push_back({prefix + "mlp.experts.down_proj", {E, H, I}});
}

void routed_experts_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  out.push_back(LoraSite{prefix + "mlp.experts.gate_up_proj", "gate_up_proj", true, E, H, 2 * I});
  out.push_back(LoraSite{prefix + "mlp.experts.down_proj", "down_proj", true, E, I, H});
}

void routed_experts_calls(const HfConfig&, const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out) {
  for (const char* proj : {"gate_up_proj", "down_proj"})
    out.push_back({"moe.mlp", ops::to_string(formats.at(prefix + "mlp.experts." + proj)), "ENK"});
}

ops::MoeRouting DecoderModel::moe_routing(const at::Tensor& top_i) const {
  ops::MoeRouting routing;
  const int64_t E = cfg_.num_experts;
  at::Tensor flat = top_i.reshape({-1});
  // Sorted on the narrowest key type that holds every expert id: a stable sort's permutation does not depend
  // on the key type, but CUDA's radix sort makes one pass (a kernel and a memset) per key byte, 8 for int64.
  const at::ScalarType key = E <= 256 ? at::kByte : E <= 32768 ? at::kShort : at::kLong;
  auto [sorted, perm] = flat.to(key).sort(/*stable=*/true, 0, false);
  routing.sorted_expert_idxs = sorted.to(at::kLong);
  routing.sorted_scattered_idxs = perm;
  // End offsets read off the sorted ids (entries with expert <= e): one search instead of a count's fill,
  // scatter_add and cumsum.
  routing.expert_offsets = at::searchsorted(routing.sorted_expert_idxs, at::arange(E, flat.options().dtype(at::kLong)),
                                            /*out_int32=*/false, /*right=*/true);
  routing.top_k = top_i.size(-1);
  return routing;
}

at::Tensor DecoderModel::expert_mlp(ops::MoeMlpArgs a, const std::string& prefix) {
  const std::string up = prefix + "gate_up_proj", down = prefix + "down_proj";
  a.gate_up = projection(up);
  a.down = projection(down);
  // tiled_mlp: packed experts decoded once per pass over the layer's shards (models/tiled_mlp.hpp).
  if (ExpertWeightCache* cache = current_expert_cache()) {
    if (!a.gate_up.is_dense()) a.gate_up = cache->get(up, a.gate_up, dtype_);
    if (!a.down.is_dense()) a.down = cache->get(down, a.down, dtype_);
  }
  a.layout = ops::ExpertLayout::ENK;  // transformers 5's fused experts: [E, 2I, H] and [E, H, I]
  a.check_values = false;             // the routing was built here
  if (const LoraModule* m = lora_.find(up)) {
    std::tie(a.gate_up_lora.a, a.gate_up_lora.b) = lora_factors(*m);
    a.gate_up_lora.scaling = m->scaling;
  }
  if (const LoraModule* m = lora_.find(down)) {
    std::tie(a.down_lora.a, a.down_lora.b) = lora_factors(*m);
    a.down_lora.scaling = m->scaling;
  }
  auto op = moe_mlp_backend(a.gate_up.format, a.down.format);
  if (ep_) return expert_parallel_mlp(*ep_, op, std::move(a), cfg_.num_experts);  // this rank holds some experts only
  return autograd::moe_mlp(op, std::move(a));
}

std::shared_ptr<ops::MoeMlp> DecoderModel::moe_mlp_backend(ops::WeightFormat gate_up, ops::WeightFormat down) {
  const std::string fu = ops::to_string(gate_up), fd = ops::to_string(down), key = fu + "/" + fd;
  auto it = moe_mlp_chains_.find(key);
  if (it != moe_mlp_chains_.end()) return it->second;
  const std::string dt = ops::dtype_name(dtype_);
  auto chain = kernels_->get_all<ops::MoeMlp>(dt, fu, "ENK");
  if (fd != fu) {
    // skip_modules may keep one projection dense: only backends that claim both formats may serve the call,
    // in the order of the gate_up format's list.
    auto other = kernels_->get_all<ops::MoeMlp>(dt, fd, "ENK");
    std::vector<std::string> names;
    for (const auto& [n, b] : other) names.push_back(n);
    chain.erase(std::remove_if(chain.begin(), chain.end(),
                               [&](const auto& c) { return std::find(names.begin(), names.end(), c.first) == names.end(); }),
                chain.end());
    if (chain.empty())
      throw UsageError(str("moe.mlp: no backend serves expert weights in ", fu, " (gate_up_proj) and ", fd,
                           " (down_proj) together; `axengine plugins explain` shows each format's list"));
  }
  std::vector<ops::NamedMoeMlp> named;
  for (auto& [n, b] : chain) named.push_back({n, b});
  return moe_mlp_chains_[key] = ops::moe_mlp_chain(std::move(named));
}

}  // namespace ax::models
