// Reference causal_conv1d in fp32 (fp64 for fp64 inputs), rounded once. Per sequence b, the W-1 rows
// before it (initial_state[b], or zeros) are put in front of its L rows:
//   ext = [state_b; x_b]            [W-1+L, C]
//   pre[p] = Σ_i weight[:, i] · ext[p + i]      (ext row p+i is sequence position p-(W-1)+i)
//   y = silu(pre),  final_state[b] = ext[L : L+W-1]   (the last W-1 inputs)
// Backward: dpre = dy · σ(pre)(1 + pre(1 − σ(pre))); dext[p + i] += weight[:, i] · dpre[p];
// dext[L : L+W-1] += grad_final_state[b]; dx_b = dext[W-1:], dinitial_state[b] = dext[:W-1].
// cu_seqlens is read on the host (one sequence at a time): not graph-safe.
#include <memory>
#include <vector>

#include "axengine/ops/causal_conv1d.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

std::vector<int64_t> offsets(const at::Tensor& cu_seqlens) {
  at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  return {cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel()};
}

// [W-1+L, C]: the sequence's rows with what comes before them.
at::Tensor extended(const CausalConv1dArgs& a, const at::Tensor& x, int64_t b, int64_t r0, int64_t r1) {
  const int64_t W = a.weight.size(1);
  at::Tensor before = a.initial_state.defined() ? a.initial_state[b].to(x.scalar_type())
                                                : at::zeros({W - 1, x.size(1)}, x.options());
  return at::cat({before, x.slice(0, r0, r1)}, 0);
}

at::Tensor pre_activation(const at::Tensor& ext, const at::Tensor& w, int64_t L) {
  at::Tensor pre = at::zeros({L, ext.size(1)}, ext.options());
  for (int64_t i = 0; i < w.size(1); ++i) pre += ext.narrow(0, i, L) * w.select(1, i);
  return pre;
}

class ReferenceCausalConv1d final : public CausalConv1d {
 protected:
  CausalConv1dResult run_forward(const CausalConv1dArgs& a) override {
    const auto dt = a.x.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t W = a.weight.size(1);
    const std::vector<int64_t> cu = offsets(a.cu_seqlens);
    const int64_t N = static_cast<int64_t>(cu.size()) - 1;
    at::Tensor x = a.x.to(ct), w = a.weight.to(ct);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor fin;
    if (a.output_final_state) fin = at::empty({N, W - 1, x.size(1)}, x.options());
    for (int64_t b = 0; b < N; ++b) {
      const int64_t L = cu[b + 1] - cu[b];
      at::Tensor ext = extended(a, x, b, cu[b], cu[b + 1]);
      y.slice(0, cu[b], cu[b + 1]).copy_(at::silu(pre_activation(ext, w, L)));
      if (fin.defined()) fin[b] = ext.narrow(0, L, W - 1);
    }
    CausalConv1dResult r;
    r.y = ref::emit(y, dt, a.out);
    if (fin.defined()) r.final_state = fin.to(dt);
    return r;
  }

  CausalConv1dGrads run_backward(const CausalConv1dArgs& a, const CausalConv1dBackwardArgs& bw) override {
    const auto dt = a.x.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t W = a.weight.size(1);
    const std::vector<int64_t> cu = offsets(a.cu_seqlens);
    const int64_t N = static_cast<int64_t>(cu.size()) - 1;
    at::Tensor x = a.x.to(ct), w = a.weight.to(ct), gy = bw.grad_y.to(ct);
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor dinit;
    if (a.initial_state.defined()) dinit = at::empty(a.initial_state.sizes(), x.options());
    for (int64_t b = 0; b < N; ++b) {
      const int64_t L = cu[b + 1] - cu[b];
      at::Tensor ext = extended(a, x, b, cu[b], cu[b + 1]);
      at::Tensor pre = pre_activation(ext, w, L);
      at::Tensor sig = at::sigmoid(pre);
      at::Tensor dpre = gy.slice(0, cu[b], cu[b + 1]) * sig * (1.0 + pre * (1.0 - sig));
      at::Tensor dext = at::zeros_like(ext);
      for (int64_t i = 0; i < W; ++i) dext.narrow(0, i, L) += dpre * w.select(1, i);
      if (bw.grad_final_state.defined()) dext.narrow(0, L, W - 1) += bw.grad_final_state[b].to(ct);
      dx.slice(0, cu[b], cu[b + 1]).copy_(dext.narrow(0, W - 1, L));
      if (dinit.defined()) dinit[b] = dext.narrow(0, 0, W - 1);
    }
    CausalConv1dGrads g;
    g.dx = dx.to(dt);
    if (dinit.defined()) g.dinitial_state = dinit.to(dt);
    return g;
  }
};

}  // namespace

std::shared_ptr<CausalConv1d> make_reference_causal_conv1d() { return std::make_shared<ReferenceCausalConv1d>(); }

}  // namespace ax::ops
