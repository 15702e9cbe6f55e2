// The `aten` linear_attention: the shared chunked gated delta rule (axengine/ops/linear_attention_chunked.hpp:
// the chunk-parallel math as batched GEMMs) with its two scans as loops of ATen ops over the chunk slots, one
// slot per iteration. docs/ops/linear_attention.md, "Backends".
//
// The loops walk all NC slots in order and reset the state at each sequence's first chunk (a `where` on the
// layout's flags, no host branch), so the call is graph-safe and deterministic. Each iteration is a few small
// launches: on the GPU the scans are launch-bound, which is what the gdn plugin's scan kernels remove.
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_attention_chunked.hpp"

namespace ax::ops {
namespace {

class AtenLinearAttention final : public ChunkedLinearAttention {
 protected:
  // V' = U − W S,  S ← γ S + K_dᵀ V'.
  void scan_forward(GdrScanForward& s) override {
    const ChunkLayout& l = *s.layout;
    at::Tensor S = at::zeros(s.S_in.sizes().slice(1), s.S_in.options());
    for (int64_t i = 0; i < l.NC; ++i) {
      // A sequence's first chunk starts from its initial state: a reset that needs no host branch.
      S = at::where(l.first.narrow(0, i, 1).view({1, 1, 1}), s.S0.index_select(0, l.seq.narrow(0, i, 1)).squeeze(0), S);
      s.S_in[i].copy_(S);
      at::Tensor vn = s.U[i] - gdr_mm(s.W[i], S, s.dtype);
      s.Vn[i].copy_(vn);
      S = s.gamma[i].view({-1, 1, 1}) * S + gdr_mm(s.Kd[i].transpose(-1, -2), vn, s.dtype);
    }
  }

  // dV' = dV'_loc + K_d dS,  dS_in = dS_loc + γ dS − Wᵀ dV'; a sequence's last chunk starts from its
  // grad_final_state.
  void scan_backward(GdrScanBackward& b) override {
    const ChunkLayout& l = *b.layout;
    at::Tensor dS = at::zeros(b.dS_out.sizes().slice(1), b.dS_out.options());
    for (int64_t i = l.NC - 1; i >= 0; --i) {
      dS = at::where(l.last.narrow(0, i, 1).view({1, 1, 1}), b.GF.index_select(0, l.seq.narrow(0, i, 1)).squeeze(0), dS);
      b.dS_out[i].copy_(dS);
      at::Tensor dvn = b.dVn_local[i] + gdr_mm(b.Kd[i], dS, b.dtype);
      b.dVn[i].copy_(dvn);
      dS = b.dS_local[i] + b.gamma[i].view({-1, 1, 1}) * dS - gdr_mm(b.W[i].transpose(-1, -2), dvn, b.dtype);
      b.dS_in[i].copy_(dS);
    }
  }
};

}  // namespace

std::shared_ptr<LinearAttention> make_aten_linear_attention() { return std::make_shared<AtenLinearAttention>(); }

}  // namespace ax::ops
