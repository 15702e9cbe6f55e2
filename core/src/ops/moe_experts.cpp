// validate() for moe.experts: every backend's input passes through here (MoeExperts::forward/backward).
#include "axengine/ops/moe_experts.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

const char* to_string(ExpertLayout layout) { return layout == ExpertLayout::EKN ? "EKN" : "ENK"; }

namespace {
constexpr const char* kOp = "moe.experts";

// Content checks on a host copy of the routing (one device sync). The first violation is reported with
// the position at fault.
void check_routing_values(const MoeRouting& r, int64_t E, int64_t M) {
  at::Tensor eid = r.sorted_expert_idxs.to(at::kCPU).contiguous();
  at::Tensor sid = r.sorted_scattered_idxs.to(at::kCPU).contiguous();
  at::Tensor off = r.expert_offsets.to(at::kCPU).contiguous();
  const int64_t* e = eid.data_ptr<int64_t>();
  const int64_t* s = sid.data_ptr<int64_t>();
  const int64_t* o = off.data_ptr<int64_t>();
  int64_t prev = 0;
  for (int64_t i = 0; i < E; ++i) {
    if (o[i] < prev || o[i] > M)
      check::fail(kOp, "routing.expert_offsets",
                  str("must be nondecreasing cumulative end offsets within [0, ", M, "], got offsets[", i, "] = ", o[i],
                      i > 0 ? str(" after ", prev) : std::string()));
    prev = o[i];
  }
  std::vector<char> seen(static_cast<size_t>(M), 0);
  int64_t expert = 0;
  for (int64_t p = 0; p < M; ++p) {
    while (expert < E && p >= o[expert]) ++expert;  // position p belongs to `expert` (E: past the end)
    if (e[p] == -1) continue;
    if (e[p] < -1 || e[p] >= E)
      check::fail(kOp, "routing.sorted_expert_idxs", str("entry ", p, " is ", e[p], ", outside [-1, ", E, ")"));
    if (e[p] != expert)
      check::fail(kOp, "routing.sorted_expert_idxs",
                  str("entry ", p, " is expert ", e[p], " but expert_offsets place position ", p,
                      expert < E ? str(" in expert ", expert, "'s range") : std::string(" past the last offset"),
                      " (routing arrays do not match)"));
    if (s[p] < 0 || s[p] >= M)
      check::fail(kOp, "routing.sorted_scattered_idxs", str("entry ", p, " is ", s[p], ", outside [0, ", M, ")"));
    if (seen[static_cast<size_t>(s[p])]++)
      check::fail(kOp, "routing.sorted_scattered_idxs", str("entry ", p, " repeats scattered index ", s[p]));
  }
}
}  // namespace

MoeDims moe_dims(const MoeExpertsArgs& a) {
  MoeDims d{};
  d.k = a.routing.top_k;
  d.M = a.routing.sorted_expert_idxs.numel();
  d.T = a.grouped_in ? d.M / std::max<int64_t>(d.k, 1) : a.x.size(0);
  d.E = a.weight.shape[0];
  const bool ekn = a.layout == ExpertLayout::EKN;
  d.K = ekn ? a.weight.shape[1] : a.weight.shape[2];
  d.N = ekn ? a.weight.shape[2] : a.weight.shape[1];
  d.r = a.lora_a.defined() ? a.lora_a.size(0) / std::max<int64_t>(d.E, 1) : 0;
  return d;
}

void validate(const MoeExpertsArgs& a) {
  check::rank(kOp, "x", a.x, 2);
  check::compute_dtype(kOp, "x", a.x);
  const at::Device dev = a.x.device();
  const auto dt = a.x.scalar_type();
  const auto& r = a.routing;
  if (r.top_k < 1) check::fail(kOp, "routing.top_k", str("must be >= 1, got ", r.top_k));
  check::rank(kOp, "routing.sorted_expert_idxs", r.sorted_expert_idxs, 1);
  check::dtype(kOp, "routing.sorted_expert_idxs", r.sorted_expert_idxs, at::kLong);
  check::same_device(kOp, "routing.sorted_expert_idxs", r.sorted_expert_idxs, "x", dev);
  const int64_t M = r.sorted_expert_idxs.numel();
  check::rank(kOp, "routing.sorted_scattered_idxs", r.sorted_scattered_idxs, 1);
  check::dtype(kOp, "routing.sorted_scattered_idxs", r.sorted_scattered_idxs, at::kLong);
  check::same_device(kOp, "routing.sorted_scattered_idxs", r.sorted_scattered_idxs, "x", dev);
  if (r.sorted_scattered_idxs.numel() != M)
    check::fail(kOp, "routing.sorted_scattered_idxs",
                str("has ", r.sorted_scattered_idxs.numel(), " entries but sorted_expert_idxs has ", M));
  check::rank(kOp, "routing.expert_offsets", r.expert_offsets, 1);
  check::dtype(kOp, "routing.expert_offsets", r.expert_offsets, at::kLong);
  check::same_device(kOp, "routing.expert_offsets", r.expert_offsets, "x", dev);

  int64_t T;
  if (a.grouped_in) {
    if (a.x.size(0) != M)
      check::fail(kOp, "x", str("grouped input must have one row per routing entry (", M, "), got ", a.x.size(0)));
    if (M % r.top_k != 0)
      check::fail(kOp, "routing.sorted_expert_idxs", str("has ", M, " entries, not a multiple of top_k ", r.top_k));
    T = M / r.top_k;
  } else {
    T = a.x.size(0);
    if (M != T * r.top_k)
      check::fail(kOp, "routing.sorted_expert_idxs",
                  str("has ", M, " entries but x has ", T, " tokens × top_k ", r.top_k, " = ", T * r.top_k));
  }

  validate_weight(a.weight, str(kOp, ": weight"));
  if (a.weight.dim() != 3)
    check::fail(kOp, "weight", str("must be 3-dim [E, K, N] or [E, N, K], got ", a.weight.describe()));
  if (a.weight.device() != dev)
    check::fail(kOp, "weight", str("is on ", a.weight.device().str(), " but x is on ", dev.str()));
  if (a.weight.is_dense() && a.weight.values.scalar_type() != dt)
    check::fail(kOp, "weight", str("must have x's dtype ", check::dtype_str(dt), ", got ",
                                   check::dtype_str(a.weight.values.scalar_type())));
  const bool ekn = a.layout == ExpertLayout::EKN;
  const int64_t E = a.weight.shape[0], K = ekn ? a.weight.shape[1] : a.weight.shape[2],
                N = ekn ? a.weight.shape[2] : a.weight.shape[1];
  if (E < 1) check::fail(kOp, "weight", "has no experts");
  if (K != a.x.size(1))
    check::fail(kOp, "weight", str("has K = ", K, " (layout ", to_string(a.layout), ", ", a.weight.describe(),
                                   ") but x has ", a.x.size(1), " features"));
  if (a.weight.format == WeightFormat::mxfp4 || a.weight.format == WeightFormat::nvfp4) {
    const int64_t axis = a.weight.axis < 0 ? a.weight.axis + 3 : a.weight.axis;
    if (axis != (ekn ? 1 : 2))
      check::fail(kOp, "weight.axis", str(to_string(a.weight.format), " blocks must run along K (dim ", ekn ? 1 : 2,
                                          " in layout ", to_string(a.layout), "), got axis ", a.weight.axis));
  }
  if (r.expert_offsets.numel() != E)
    check::fail(kOp, "routing.expert_offsets", str("must have one entry per expert (", E, "), got ", r.expert_offsets.numel()));

  if (a.lora_a.defined() != a.lora_b.defined())
    check::fail(kOp, a.lora_a.defined() ? "lora_b" : "lora_a", "LoRA needs both lora_a and lora_b");
  if (a.lora_a.defined()) {
    check::rank(kOp, "lora_a", a.lora_a, 2);
    check::dtype(kOp, "lora_a", a.lora_a, dt);
    check::same_device(kOp, "lora_a", a.lora_a, "x", dev);
    const int64_t rE = a.lora_a.size(0);
    if (rE < E || rE % E != 0)
      check::fail(kOp, "lora_a", str("must be [r·E, K] with E = ", E, ", got ", check::shape_str(a.lora_a.sizes())));
    check::shape(kOp, "lora_a", a.lora_a, {rE, K});
    check::shape(kOp, "lora_b", a.lora_b, {N, rE});
    check::dtype(kOp, "lora_b", a.lora_b, dt);
    check::same_device(kOp, "lora_b", a.lora_b, "x", dev);
  }
  if (a.bias.defined()) {
    check::shape(kOp, "bias", a.bias, {E, N});
    check::dtype(kOp, "bias", a.bias, dt);
    check::same_device(kOp, "bias", a.bias, "x", dev);
  }
  if (a.gates.defined()) {
    if (a.grouped_out) check::fail(kOp, "gates", "cannot combine outputs in grouped order (grouped_out = true)");
    check::shape(kOp, "gates", a.gates, {T, r.top_k});
    check::dtype(kOp, "gates", a.gates, dt);
    check::same_device(kOp, "gates", a.gates, "x", dev);
  }
  const std::vector<int64_t> y_shape = a.gates.defined() ? std::vector<int64_t>{T, N} : std::vector<int64_t>{M, N};
  check::out_like(kOp, "out", a.out, y_shape, dt, dev);
  if (a.check_values) check_routing_values(r, E, M);
}

void validate_backward(const MoeExpertsArgs& a, const MoeExpertsBackwardArgs& b) {
  const MoeDims d = moe_dims(a);
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  const std::vector<int64_t> y_shape = a.gates.defined() ? std::vector<int64_t>{d.T, d.N} : std::vector<int64_t>{d.M, d.N};
  check::defined(kOp, "grad_y", b.grad_y);
  check::out_like(kOp, "grad_y", b.grad_y, y_shape, dt, dev);
  check::out_like(kOp, "out.dx", b.out.dx, a.x.sizes(), dt, dev);
  if (a.lora_a.defined()) {
    check::out_like(kOp, "out.dlora_a", b.out.dlora_a, a.lora_a.sizes(), dt, dev);
    check::out_like(kOp, "out.dlora_b", b.out.dlora_b, a.lora_b.sizes(), dt, dev);
  }
  if (a.gates.defined()) check::out_like(kOp, "out.dgates", b.out.dgates, a.gates.sizes(), dt, dev);
}

}  // namespace ax::ops
