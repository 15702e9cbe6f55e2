// The group-limited sigmoid router (DeepSeek-V3, GLM-4.5): see group_topk_router.hpp.
#include "models/parts/group_topk_router.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <limits>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/hf_config.hpp"

namespace ax::models {

GroupTopkRouting group_routing(const HfConfig& c) {
  GroupTopkRouting r;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.top_k = c.top_k;
  r.norm_topk_prob = c.norm_topk_prob;
  r.routed_scaling_factor = c.routed_scaling_factor;
  return r;
}

void check_group_topk(const GroupTopkRouting& r, int64_t E, const std::string& source) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw UsageError(str(source, ": ", key, ": ", what));
  };
  if (r.n_group < 1) fail("n_group", str("must be >= 1, got ", r.n_group));
  if (E % r.n_group != 0)
    fail("n_group", str(r.n_group, " does not divide n_routed_experts ", E, " (experts are grouped evenly)"));
  if (E / r.n_group < 2)
    fail("n_group", str(r.n_group, " groups of ", E, " experts leave fewer than 2 per group (a group is scored by its best two)"));
  if (r.topk_group < 1 || r.topk_group > r.n_group)
    fail("topk_group", str("must be in [1, n_group = ", r.n_group, "], got ", r.topk_group));
  const int64_t reachable = r.topk_group * (E / r.n_group);
  if (r.top_k < 1 || r.top_k > reachable)
    fail("num_experts_per_tok", str("must be in [1, ", reachable, "] (the experts of topk_group = ", r.topk_group,
                                    " groups of ", E / r.n_group, "), got ", r.top_k));
}

GroupTopkChoice group_topk_route(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const GroupTopkRouting& r) {
  GroupTopkChoice c;
  const int64_t E = weight.size(0), G = r.n_group;
  c.logits = at::linear(x.reshape({-1, x.size(-1)}).to(at::kFloat), weight.to(at::kFloat));  // [T, E]
  const int64_t T = c.logits.size(0);
  const at::Tensor scores = at::sigmoid(c.logits);
  {
    // The choice: no gradient (indices only), on the bias-corrected scores.
    at::NoGradGuard no_grad;
    at::Tensor choice = bias.defined() ? scores.detach() + bias.to(at::kFloat) : scores.detach();
    if (r.topk_group < G) {
      at::Tensor group_scores = std::get<0>(choice.view({T, G, E / G}).topk(2, -1)).sum(-1);     // [T, G]
      at::Tensor kept = std::get<1>(group_scores.topk(r.topk_group, -1, /*largest=*/true, /*sorted=*/false));
      at::Tensor mask = at::zeros({T, G}, choice.options().dtype(at::kBool)).scatter_(1, kept, true);
      choice = choice.masked_fill(~mask.unsqueeze(-1).expand({T, G, E / G}).reshape({T, E}),
                                  -std::numeric_limits<float>::infinity());
    }
    c.indices = std::get<1>(choice.topk(r.top_k, -1, /*largest=*/true, /*sorted=*/false));
  }
  at::Tensor w = scores.gather(1, c.indices);
  if (r.norm_topk_prob) w = w / (w.sum(-1, /*keepdim=*/true) + 1e-20);
  c.weights = w * r.routed_scaling_factor;
  return c;
}

}  // namespace ax::models
