// Reference moe.experts: gather each routing entry's input row, run one matmul per expert that has
// tokens (dequantising only that expert's weight), scatter back. fp32 math, outputs rounded once.
//
// Forward, per active entry p of expert e (x_p its input row, W_e as [K, N]):
//   y_p = x_p·W_e + bias_e + s·(x_p·A_eᵀ)·B_eᵀ
// Backward, with g_p the gradient reaching y_p (gates folded in):
//   dx_p = g_p·W_eᵀ + s·(g_p·B_e)·A_e,  dA_e = s·Σ_p (g_p·B_e)ᵀ x_p,  dB_e = s·Σ_p g_pᵀ (x_p·A_eᵀ)
//   dgates[t, j] = <grad_out[t], y_{t,j}>,   dx[t] = Σ_j dx_{t,j} (scattered input)
// Every sum has a fixed order (no index_add_/atomics): the results are deterministic on CUDA too.
#include <memory>

#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/quant.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

// What forward and backward share: each active entry's input row (grouped order) and each expert's
// active positions.
struct Plan {
  MoeDims d;
  at::ScalarType ct;
  at::Tensor active;                 // bool [M]
  at::Tensor xg;                     // [M, K] compute type, zero rows where inactive
  std::vector<int64_t> experts;      // experts with at least one active entry
  std::vector<at::Tensor> positions; // per listed expert: int64 positions (grouped order)
};

Plan plan(const MoeExpertsArgs& a) {
  Plan p;
  p.d = moe_dims(a);
  p.ct = ref::compute_type(a.x.scalar_type());
  const auto& r = a.routing;
  p.active = r.sorted_expert_idxs >= 0;
  if (a.grouped_in) {
    p.xg = a.x.to(p.ct);
  } else {
    at::Tensor rows = at::where(p.active, r.sorted_scattered_idxs, 0).div(p.d.k, "floor");
    p.xg = a.x.index_select(0, rows).to(p.ct);
  }
  p.xg = p.xg * p.active.unsqueeze(1).to(p.ct);
  at::Tensor offsets = r.expert_offsets.to(at::kCPU).contiguous();
  at::Tensor act = p.active.to(at::kCPU).contiguous();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const bool* on = act.data_ptr<bool>();
  int64_t start = 0;
  for (int64_t e = 0; e < p.d.E; ++e) {
    std::vector<int64_t> pos;
    for (int64_t i = start; i < off[e]; ++i)
      if (on[i]) pos.push_back(i);
    start = off[e];
    if (pos.empty()) continue;
    p.experts.push_back(e);
    p.positions.push_back(at::tensor(pos, at::kLong).to(a.x.device()));
  }
  return p;
}

// Expert e's weight as [K, N] in the compute type (dequantising only e). A packed weight is decoded into
// x's dtype first, then widened: the op multiplies the weight as the compute dtype holds it
// (docs/ops/moe.experts.md), which is what kernels that decode tile by tile feed their MMAs. Decoding
// straight to fp32 would differ from every such kernel by one bf16 rounding per weight, and moe.mlp's
// clamped_glu turns pre-activation differences of one ulp at ±limit into whole gradient entries.
at::Tensor expert_weight(const MoeExpertsArgs& a, int64_t e, at::ScalarType ct) {
  at::Tensor ids = at::full({1}, e, at::TensorOptions().dtype(at::kLong).device(a.x.device()));
  at::Tensor w = dequantize(a.weight, a.x.scalar_type(), ids).squeeze(0).to(ct);
  return a.layout == ExpertLayout::EKN ? w : w.t();
}

at::Tensor lora_a_of(const MoeExpertsArgs& a, int64_t e, int64_t r, at::ScalarType ct) {
  return a.lora_a.slice(0, e * r, (e + 1) * r).to(ct);  // [r, K]
}
at::Tensor lora_b_of(const MoeExpertsArgs& a, int64_t e, int64_t r, at::ScalarType ct) {
  return a.lora_b.slice(1, e * r, (e + 1) * r).to(ct);  // [N, r]
}

// Ungated per-entry outputs in grouped order, [M, N], zero rows where inactive.
at::Tensor grouped_outputs(const MoeExpertsArgs& a, const Plan& p) {
  at::Tensor yg = at::zeros({p.d.M, p.d.N}, a.x.options().dtype(p.ct));
  for (size_t i = 0; i < p.experts.size(); ++i) {
    const int64_t e = p.experts[i];
    at::Tensor x = p.xg.index_select(0, p.positions[i]);
    at::Tensor y = at::matmul(x, expert_weight(a, e, p.ct));
    if (a.bias.defined()) y = y + a.bias[e].to(p.ct);
    if (p.d.r > 0)
      y = y + a.scaling * at::matmul(at::matmul(x, lora_a_of(a, e, p.d.r, p.ct).t()), lora_b_of(a, e, p.d.r, p.ct).t());
    yg.index_copy_(0, p.positions[i], y);
  }
  return yg;
}

// Grouped [M, C] → scattered [M, C]: row sorted_scattered_idxs[p] = row p (active rows only; the indices
// are unique, so index_copy_ is deterministic).
at::Tensor to_scattered(const MoeExpertsArgs& a, const Plan& p, const at::Tensor& grouped) {
  at::Tensor idx = p.active.nonzero().squeeze(1);
  at::Tensor out = at::zeros_like(grouped);
  out.index_copy_(0, a.routing.sorted_scattered_idxs.index_select(0, idx), grouped.index_select(0, idx));
  return out;
}

// Scattered [M, C] → grouped [M, C], zero rows where inactive.
at::Tensor to_grouped(const MoeExpertsArgs& a, const Plan& p, const at::Tensor& scattered) {
  at::Tensor rows = at::where(p.active, a.routing.sorted_scattered_idxs, 0);
  return scattered.index_select(0, rows) * p.active.unsqueeze(1).to(scattered.scalar_type());
}

class ReferenceMoeExperts final : public MoeExperts {
 protected:
  MoeExpertsResult run_forward(const MoeExpertsArgs& a) override {
    Plan p = plan(a);
    at::Tensor y = grouped_outputs(a, p);
    if (!a.grouped_out) y = to_scattered(a, p, y);
    if (a.gates.defined())  // out[t] = Σ_j gates[t, j]·y[t·k + j]
      y = (y.view({p.d.T, p.d.k, p.d.N}) * a.gates.to(p.ct).unsqueeze(-1)).sum(1);
    MoeExpertsResult r;
    r.y = ref::emit(y, a.x.scalar_type(), a.out);
    return r;
  }

  MoeExpertsGrads run_backward(const MoeExpertsArgs& a, const MoeExpertsBackwardArgs& b) override {
    const auto dt = a.x.scalar_type();
    Plan p = plan(a);
    const auto& d = p.d;
    at::Tensor gy = b.grad_y.to(p.ct);
    MoeExpertsGrads out;

    // Gradient reaching each entry's ungated output, in grouped order.
    at::Tensor gg;
    if (a.gates.defined()) {
      if (b.need_dgates) {
        at::Tensor ys = to_scattered(a, p, grouped_outputs(a, p)).view({d.T, d.k, d.N});
        out.dgates = ref::emit((ys * gy.unsqueeze(1)).sum(-1), dt, b.out.dgates);
      }
      at::Tensor gs = (gy.unsqueeze(1) * a.gates.to(p.ct).unsqueeze(-1)).reshape({d.M, d.N});
      gg = to_grouped(a, p, gs);
    } else {
      gg = a.grouped_out ? gy * p.active.unsqueeze(1).to(p.ct) : to_grouped(a, p, gy);
    }

    const bool lora = d.r > 0 && b.need_dlora;
    at::Tensor dxg = at::zeros({d.M, d.K}, gy.options());
    at::Tensor da = lora ? at::zeros(a.lora_a.sizes(), gy.options()) : at::Tensor();
    at::Tensor db = lora ? at::zeros(a.lora_b.sizes(), gy.options()) : at::Tensor();
    for (size_t i = 0; i < p.experts.size(); ++i) {
      const int64_t e = p.experts[i];
      at::Tensor g = gg.index_select(0, p.positions[i]);  // [n, N]
      at::Tensor x = p.xg.index_select(0, p.positions[i]);  // [n, K]
      at::Tensor A = d.r > 0 ? lora_a_of(a, e, d.r, p.ct) : at::Tensor();
      at::Tensor B = d.r > 0 ? lora_b_of(a, e, d.r, p.ct) : at::Tensor();
      at::Tensor gB = d.r > 0 ? at::matmul(g, B) : at::Tensor();  // [n, r]
      if (b.need_dx) {
        at::Tensor dx = at::matmul(g, expert_weight(a, e, p.ct).t());
        if (d.r > 0) dx = dx + a.scaling * at::matmul(gB, A);
        dxg.index_copy_(0, p.positions[i], dx);
      }
      if (lora) {
        da.slice(0, e * d.r, (e + 1) * d.r).copy_(a.scaling * at::matmul(gB.t(), x));
        db.slice(1, e * d.r, (e + 1) * d.r).copy_(a.scaling * at::matmul(g.t(), at::matmul(x, A.t())));
      }
    }
    if (b.need_dx) {
      at::Tensor dx = a.grouped_in ? dxg : to_scattered(a, p, dxg).view({d.T, d.k, d.K}).sum(1);
      out.dx = ref::emit(dx, dt, b.out.dx);
    }
    if (lora) {
      out.dlora_a = ref::emit(da, dt, b.out.dlora_a);
      out.dlora_b = ref::emit(db, dt, b.out.dlora_b);
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<MoeExperts> make_reference_moe_experts() { return std::make_shared<ReferenceMoeExperts>(); }

}  // namespace ax::ops
