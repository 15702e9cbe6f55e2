// validate() for moe.mlp: every backend's input passes through here (MoeMlp::forward/backward). The
// block's own arguments are checked here; the two projections are then checked as the moe.experts calls
// they are (routing, weight formats, LoRA and bias shapes), with the argument names translated back.
#include "axengine/ops/moe_mlp.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

const char* to_string(MoeActivation a) { return a == MoeActivation::silu_glu ? "silu_glu" : "clamped_glu"; }
const char* to_string(GluPacking p) { return p == GluPacking::halves ? "halves" : "interleaved"; }

namespace {
constexpr const char* kOp = "moe.mlp";

// Logical (K, N) of a [E, K, N] / [E, N, K] weight.
std::pair<int64_t, int64_t> kn(const WeightTensor& w, ExpertLayout layout) {
  return layout == ExpertLayout::EKN ? std::pair{w.shape[1], w.shape[2]} : std::pair{w.shape[2], w.shape[1]};
}

// Runs moe.experts' validate on one projection's call and rethrows its message under moe.mlp's names
// ("moe.experts: bias: ..." → "moe.mlp: down_bias: ...").
void validate_projection(const MoeExpertsArgs& a, bool down) {
  try {
    validate(a);
  } catch (const UsageError& e) {
    std::string m = e.what();
    const std::string head = "moe.experts: ";
    if (m.rfind(head, 0) != 0) throw;
    m = m.substr(head.size());
    const auto colon = m.find(": ");
    std::string arg = m.substr(0, colon), rest = colon == std::string::npos ? "" : m.substr(colon + 2);
    const std::string proj = down ? "down" : "gate_up";
    if (arg == "weight") arg = proj;
    else if (arg.rfind("weight.", 0) == 0) arg = proj + arg.substr(6);
    else if (arg == "bias") arg = proj + "_bias";
    else if (arg == "lora_a") arg = proj + "_lora.a";
    else if (arg == "lora_b") arg = proj + "_lora.b";
    else if (arg == "x" && down) arg = "down";  // h's width is I: a mismatch is the down weight's K
    throw UsageError(str(kOp, ": ", arg, ": ", rest));
  }
}
}  // namespace

MoeMlpDims moe_mlp_dims(const MoeMlpArgs& a) {
  MoeMlpDims d{};
  d.k = a.routing.top_k;
  d.M = a.routing.sorted_expert_idxs.numel();
  d.T = a.x.size(0);
  d.H = a.x.size(1);
  d.E = a.gate_up.shape[0];
  d.I = kn(a.gate_up, a.layout).second / 2;
  return d;
}

MoeExpertsArgs moe_mlp_gate_up_args(const MoeMlpArgs& a) {
  MoeExpertsArgs e;
  e.x = a.x;
  e.routing = a.routing;
  e.weight = a.gate_up;
  e.layout = a.layout;
  e.lora_a = a.gate_up_lora.a;
  e.lora_b = a.gate_up_lora.b;
  e.scaling = a.gate_up_lora.scaling;
  e.bias = a.gate_up_bias;
  e.grouped_out = true;
  e.check_values = a.check_values;
  return e;
}

MoeExpertsArgs moe_mlp_down_args(const MoeMlpArgs& a, const at::Tensor& h) {
  MoeExpertsArgs e;
  e.x = h;
  e.routing = a.routing;
  e.weight = a.down;
  e.layout = a.layout;
  e.lora_a = a.down_lora.a;
  e.lora_b = a.down_lora.b;
  e.scaling = a.down_lora.scaling;
  e.bias = a.down_bias;
  e.gates = a.gates;
  e.grouped_in = true;
  e.out = a.out;
  e.check_values = false;  // the same routing was checked with the gate_up call
  return e;
}

void validate(const MoeMlpArgs& a) {
  check::rank(kOp, "x", a.x, 2);
  check::compute_dtype(kOp, "x", a.x);
  check::rank(kOp, "gates", a.gates, 2);  // required: the block always combines
  for (const auto* w : {&a.gate_up, &a.down}) {
    const char* name = w == &a.gate_up ? "gate_up" : "down";
    if (w->dim() != 3)
      check::fail(kOp, name, str("must be 3-dim [E, K, N] or [E, N, K], got ", w->describe()));
  }
  const auto [K1, N1] = kn(a.gate_up, a.layout);
  const auto [K2, N2] = kn(a.down, a.layout);
  const int64_t H = a.x.size(1);
  if (K1 != H)
    check::fail(kOp, "gate_up", str("has K = ", K1, " (layout ", to_string(a.layout), ", ", a.gate_up.describe(),
                                    ") but x has ", H, " features"));
  if (N1 % 2 != 0)
    check::fail(kOp, "gate_up", str("must have 2I outputs (gate and up), got ", N1, " (layout ", to_string(a.layout), ")"));
  if (a.down.shape[0] != a.gate_up.shape[0])
    check::fail(kOp, "down", str("has ", a.down.shape[0], " experts but gate_up has ", a.gate_up.shape[0]));
  if (K2 != N1 / 2)
    check::fail(kOp, "down", str("must take I = ", N1 / 2, " inputs (gate_up has 2I = ", N1, " outputs), got ", K2,
                                 " (layout ", to_string(a.layout), ", ", a.down.describe(), ")"));
  if (N2 != H)
    check::fail(kOp, "down", str("must produce H = ", H, " outputs (x's width), got ", N2, " (layout ",
                                 to_string(a.layout), ", ", a.down.describe(), ")"));
  if (a.activation == MoeActivation::clamped_glu && !(a.limit > 0))
    check::fail(kOp, "limit", str("must be > 0 for clamped_glu, got ", a.limit));
  validate_projection(moe_mlp_gate_up_args(a), false);
  // h stands in as a broadcast view: no memory, the right shape, dtype and device.
  const at::Tensor h = at::empty({1, 1}, a.x.options()).expand({a.routing.sorted_expert_idxs.numel(), N1 / 2});
  validate_projection(moe_mlp_down_args(a, h), true);
}

void validate_backward(const MoeMlpArgs& a, const MoeMlpBackwardArgs& b) {
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  check::defined(kOp, "grad_y", b.grad_y);
  check::out_like(kOp, "grad_y", b.grad_y, a.x.sizes(), dt, dev);
  check::out_like(kOp, "out.dx", b.out.dx, a.x.sizes(), dt, dev);
  if (a.gate_up_lora.defined()) {
    check::out_like(kOp, "out.dgate_up_lora_a", b.out.dgate_up_lora_a, a.gate_up_lora.a.sizes(), dt, dev);
    check::out_like(kOp, "out.dgate_up_lora_b", b.out.dgate_up_lora_b, a.gate_up_lora.b.sizes(), dt, dev);
  }
  if (a.down_lora.defined()) {
    check::out_like(kOp, "out.ddown_lora_a", b.out.ddown_lora_a, a.down_lora.a.sizes(), dt, dev);
    check::out_like(kOp, "out.ddown_lora_b", b.out.ddown_lora_b, a.down_lora.b.sizes(), dt, dev);
  }
  check::out_like(kOp, "out.dgates", b.out.dgates, a.gates.sizes(), dt, dev);
}

}  // namespace ax::ops
