// moe.mlp from moe.experts calls (compose_moe_mlp), the GLU activations between them, and the run-time
// fallback chain (moe_mlp_chain). Mechanism, not a built-in: plugins compose their own moe.experts
// kernels with it (scattermoe), so it lives in libaxengine.
#include <mutex>
#include <set>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/ops/decline_chain.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/strings.hpp"

namespace ax::ops {
namespace {

at::ScalarType math_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// gate and up as views of u [M, 2I] in the packing's columns.
std::pair<at::Tensor, at::Tensor> gate_up_views(const at::Tensor& u, GluPacking p) {
  const int64_t I = u.size(1) / 2;
  if (p == GluPacking::halves) return {u.narrow(1, 0, I), u.narrow(1, I, I)};
  return {u.slice(1, 0, 2 * I, 2), u.slice(1, 1, 2 * I, 2)};
}

}  // namespace

// The last product of each formula is written straight into the result in u's dtype (mul_out computes in
// the math type and rounds once on store, exactly as a separate .to() would): no fp32 temporary, no cast
// kernel, no cat — fewer launches per MoE layer, the same bits.
at::Tensor moe_glu(const at::Tensor& u, const MoeMlpArgs& a) {
  auto [g, v] = gate_up_views(u.to(math_type(u.scalar_type())), a.packing);
  at::Tensor h = at::empty({u.size(0), u.size(1) / 2}, u.options());
  if (a.activation == MoeActivation::silu_glu) {
    at::mul_out(h, at::silu(g), v);
  } else {
    at::Tensor gc = g.clamp_max(a.limit), vc = v.clamp(-a.limit, a.limit);
    at::mul_out(h, vc + 1, gc * at::sigmoid(gc * a.alpha));
  }
  return h;
}

at::Tensor moe_glu_backward(const at::Tensor& u, const at::Tensor& grad_h, const MoeMlpArgs& a) {
  const auto mt = math_type(u.scalar_type());
  auto [g, v] = gate_up_views(u.to(mt), a.packing);
  // du in u's dtype; dg and dv land in its gate and up columns. grad_h stays in its dtype: the first
  // product widens it on load, as a cast kernel would.
  at::Tensor du = at::empty(u.sizes(), u.options());
  auto [dg, dv] = gate_up_views(du, a.packing);
  const at::Tensor& gh = grad_h;
  if (a.activation == MoeActivation::silu_glu) {
    at::Tensor s = at::sigmoid(g);
    at::mul_out(dg, gh * v * s, 1 + g * (1 - s));  // d silu(g)/dg = σ(g)(1 + g(1 − σ(g)))
    at::mul_out(dv, gh * g, s);
  } else {
    // torch.clamp passes the gradient where the input lies inside [min, max] (ends included).
    at::Tensor gc = g.clamp_max(a.limit), vc = v.clamp(-a.limit, a.limit);
    at::Tensor s = at::sigmoid(gc * a.alpha);
    at::mul_out(dg, gh * (vc + 1) * (s + gc * a.alpha * s * (1 - s)), g.le(a.limit).to(mt));
    at::mul_out(dv, gh * gc * s, (v.ge(-a.limit) & v.le(a.limit)).to(mt));
  }
  return du;
}

namespace {

class ComposedMoeMlp final : public MoeMlp {
 public:
  explicit ComposedMoeMlp(std::shared_ptr<MoeExperts> experts) : ex_(std::move(experts)) {}

 protected:
  // The moe.mlp args were validated (routing content included): the inner calls skip the value checks.
  static MoeExpertsArgs up_args(const MoeMlpArgs& a) {
    MoeExpertsArgs e = moe_mlp_gate_up_args(a);
    e.check_values = false;
    return e;
  }

  MoeMlpResult run_forward(const MoeMlpArgs& a) override {
    auto ru = ex_->forward(up_args(a));  // u [M, 2I], grouped; zero rows for inactive entries
    at::Tensor h = moe_glu(ru.y, a);     // act(0) = 0 for both activations: inactive rows stay zero
    auto rd = ex_->forward(moe_mlp_down_args(a, h));
    MoeMlpResult r;
    r.y = rd.y;
    // saved: u, h, the count of the gate_up call's saved tensors (a CPU scalar: read without a device
    // sync), then both calls' own saved tensors.
    r.saved = {ru.y, h, at::scalar_tensor(static_cast<int64_t>(ru.saved.size()), at::kLong)};
    r.saved.insert(r.saved.end(), ru.saved.begin(), ru.saved.end());
    r.saved.insert(r.saved.end(), rd.saved.begin(), rd.saved.end());
    return r;
  }

  MoeMlpGrads run_backward(const MoeMlpArgs& a, const MoeMlpBackwardArgs& b) override {
    if (b.saved.size() < 3) throw UsageError("moe.mlp: saved: not the saved tensors of this backend's forward");
    const at::Tensor& u = b.saved[0];
    const at::Tensor& h = b.saved[1];
    const auto n_up = static_cast<std::ptrdiff_t>(b.saved[2].item<int64_t>());
    const auto up_begin = b.saved.begin() + 3;
    MoeMlpGrads g;

    const bool need_up = b.need_dx || (b.need_dlora && a.gate_up_lora.defined());
    MoeExpertsBackwardArgs db;
    db.grad_y = b.grad_y;
    db.saved.assign(up_begin + n_up, b.saved.end());
    db.need_dx = need_up;  // dh feeds the gate_up backward
    db.need_dlora = b.need_dlora;
    db.need_dgates = b.need_dgates;
    db.out.dlora_a = b.out.ddown_lora_a;
    db.out.dlora_b = b.out.ddown_lora_b;
    db.out.dgates = b.out.dgates;
    MoeExpertsArgs down = moe_mlp_down_args(a, h);
    down.out = at::Tensor();  // y's buffer is not backward's business
    auto gd = ex_->backward(down, db);
    g.ddown_lora_a = gd.dlora_a;
    g.ddown_lora_b = gd.dlora_b;
    g.dgates = gd.dgates;
    if (!need_up) return g;

    MoeExpertsBackwardArgs ub;
    ub.grad_y = moe_glu_backward(u, gd.dx, a);  // exact zeros where dh is (inactive entries)
    ub.saved.assign(up_begin, up_begin + n_up);
    ub.need_dx = b.need_dx;
    ub.need_dlora = b.need_dlora;
    ub.need_dgates = false;
    ub.out.dx = b.out.dx;
    ub.out.dlora_a = b.out.dgate_up_lora_a;
    ub.out.dlora_b = b.out.dgate_up_lora_b;
    auto gu = ex_->backward(up_args(a), ub);
    g.dx = gu.dx;
    g.dgate_up_lora_a = gu.dlora_a;
    g.dgate_up_lora_b = gu.dlora_b;
    return g;
  }

 private:
  std::shared_ptr<MoeExperts> ex_;
};

}  // namespace

std::shared_ptr<MoeMlp> compose_moe_mlp(std::shared_ptr<MoeExperts> experts) {
  return std::make_shared<ComposedMoeMlp>(std::move(experts));
}

std::shared_ptr<MoeMlp> moe_mlp_chain(std::vector<NamedMoeMlp> backends) {
  return std::make_shared<DeclineChain<MoeMlp, NamedMoeMlp, MoeMlpArgs, MoeMlpResult, MoeMlpBackwardArgs, MoeMlpGrads>>(
      std::move(backends));
}

}  // namespace ax::ops
