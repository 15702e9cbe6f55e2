// The `aten` linear_attention: the chunked (WY / UT-transform) form of the gated delta rule that
// flash-linear-attention and transformers' torch_chunk_gated_delta_rule use, chunk 64, over packed
// sequences, with a hand-derived chunked backward. docs/ops/linear_attention.md, "Backends".
//
// Per chunk of C rows of one sequence and value head (q scaled and normalised, heads repeated), with
// G = cumsum(g) inside the chunk, Γ_ij = exp(G_i − G_j) for j <= i (0 above), γ = exp(G_last):
//   L = strict_lower(diag(β) K Kᵀ ∘ Γ),   T = (I + L)⁻¹           the UT transform
//   U = T diag(β) V,   W = T diag(β e^G) K                         (fla's u and w)
//   P = (Q Kᵀ) ∘ Γ,    Q_g = diag(e^G) Q,   K_d = diag(e^{G_last − G}) K
// and the scan over the chunks of a sequence, S the state entering the chunk:
//   V' = U − W S,   O = Q_g S + P V',   S ← γ S + K_dᵀ V'
// Backward (dS_out = ∂L/∂S leaving the chunk; the reverse scan carries dS):
//   dV' = Pᵀ dO + K_d dS_out,   dS_in = Q_gᵀ dO + γ dS_out − Wᵀ dV'
// then, chunk-parallel: dU = dV', dW = −dV' S_inᵀ, dT = dU (βV)ᵀ + dW (βe^G K)ᵀ, dL = −Tᵀ dT Tᵀ (strictly
// lower), and the chain rule through L, P, Q_g, K_d, γ, Γ and G = cumsum(g) (dg = reverse cumsum of dG).
//
// Packed sequences without a host sync: every sequence's chunks get slots in one padded [NC, C] layout
// (NC = T/C + N bounds the chunk count from the shapes alone), rows are gathered into it and back out by
// index maps built on the device from cu_seqlens, padding rows carry β = g = 0 and zero q/k/v (they change
// nothing), and the scan walks all NC slots in order, resetting the state at each sequence's first chunk.
// So the call is graph-safe and deterministic (gathers, fixed-order matmuls and reductions, no atomics).
//
// Precision, as flash-linear-attention's kernels: every matmul operand is rounded to the compute dtype and
// accumulated in fp32 (mm32 below); the state, the decays, the UT solve and everything elementwise are fp32.
#include <cmath>
#include <limits>
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_attention_chunks.hpp"

namespace ax::ops {
namespace {

constexpr int64_t kChunk = 64;

// The precision the math runs in: fp32 (fp64 for fp64 inputs).
at::ScalarType gdr_wide_of(at::ScalarType dt) { return dt == at::kDouble ? at::kDouble : at::kFloat; }

// a·b with both operands rounded to the compute dtype `dt` and the product accumulated and returned in fp32
// (bf16/fp16 GEMMs with an fp32 result on CUDA; on the CPU the rounded operands are multiplied in fp32).
at::Tensor mm32(const at::Tensor& a, const at::Tensor& b, at::ScalarType dt) {
  const auto wide = gdr_wide_of(dt);
  if (dt == wide) return at::matmul(a, b);
  at::Tensor ar = a.to(dt), br = b.to(dt);
  if (a.is_cuda()) {
    auto lead = a.sizes().slice(0, a.dim() - 2).vec();
    at::Tensor o = at::bmm(ar.reshape({-1, a.size(-2), a.size(-1)}), br.reshape({-1, b.size(-2), b.size(-1)}), wide);
    lead.insert(lead.end(), {a.size(-2), b.size(-1)});
    return o.view(lead);
  }
  return at::matmul(ar.to(wide), br.to(wide));
}

at::Tensor tr(const at::Tensor& t) { return t.transpose(-1, -2); }

// (I + L)⁻¹ for strictly lower L [.., C, C], by forward substitution in fp32: with A = −L and R = T − I,
// row i of R is A_i + A_i R (only rows < i of R are needed, and they are final). Deterministic, graph-safe.
at::Tensor unit_lower_inverse(const at::Tensor& L) {
  at::Tensor A = -L;
  at::Tensor R = A.clone();
  for (int64_t i = 1; i < kChunk; ++i) {
    at::Tensor row = A.narrow(-2, i, 1).narrow(-1, 0, i);
    R.narrow(-2, i, 1).narrow(-1, 0, i).copy_(row + at::matmul(row, R.narrow(-2, 0, i).narrow(-1, 0, i)));
  }
  return R + at::eye(kChunk, L.options());
}

// Everything of the forward that does not depend on the state, chunk-parallel, in fp32 ([NC, Hv, C, ...]).
struct Chunks {
  ChunkLayout l;
  at::Tensor qhat, khat, rq, rk;  // [T, Hk, Dk] normalised q/k and the norms' rstd (undefined without)
  double scale = 1.0;
  at::Tensor Q, K, V, beta, G;    // chunks; G = cumsum(g) inside each chunk
  at::Tensor Gamma, KK, QK, Tm;   // [NC, Hv, C, C]
  at::Tensor eG, Vb, Kbg, U, W, P, Qg, Kd, gamma;
  at::Tensor S0;                  // [N+1, Hv, Dk, Dv]: initial states, and zeros for padding slots
};

Chunks prepare(const LinearAttentionArgs& a, const ChunkLayout& l) {
  const auto dt = a.q.scalar_type();
  const auto wide = gdr_wide_of(dt);
  Chunks c;
  c.l = l;
  c.scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(a.q.size(2)));
  c.qhat = a.q.to(wide);
  c.khat = a.k.to(wide);
  if (a.qk_l2norm) {
    c.rq = at::rsqrt(c.qhat.square().sum(-1, /*keepdim=*/true).add_(kLinearAttentionL2Eps));
    c.rk = at::rsqrt(c.khat.square().sum(-1, /*keepdim=*/true).add_(kLinearAttentionL2Eps));
    c.qhat = c.qhat * c.rq;
    c.khat = c.khat * c.rk;
  }
  const int64_t group = a.v.size(1) / a.q.size(1);
  c.Q = to_chunks(c.qhat.repeat_interleave(group, 1) * c.scale, l);  // [NC, Hv, C, Dk]
  c.K = to_chunks(c.khat.repeat_interleave(group, 1), l);
  c.V = to_chunks(a.v.to(wide), l);                                   // [NC, Hv, C, Dv]
  c.beta = to_chunks(a.beta.to(wide), l);                             // [NC, Hv, C]
  c.G = at::cumsum(to_chunks(a.g.to(wide), l), -1);
  const at::Tensor above = at::ones({kChunk, kChunk}, a.q.options().dtype(at::kBool)).triu(1);
  const at::Tensor on_or_above = at::ones({kChunk, kChunk}, a.q.options().dtype(at::kBool)).triu(0);
  // Γ: masked before the exp, so that G_i − G_j > 0 above the diagonal cannot overflow.
  c.Gamma = (c.G.unsqueeze(-1) - c.G.unsqueeze(-2)).masked_fill(above, -std::numeric_limits<double>::infinity()).exp();
  c.KK = mm32(c.K, tr(c.K), dt);
  c.Tm = unit_lower_inverse((c.beta.unsqueeze(-1) * c.KK * c.Gamma).masked_fill(on_or_above, 0.0));
  c.eG = c.G.exp();
  c.Vb = c.V * c.beta.unsqueeze(-1);
  c.Kbg = c.K * (c.beta * c.eG).unsqueeze(-1);
  c.U = mm32(c.Tm, c.Vb, dt);
  c.W = mm32(c.Tm, c.Kbg, dt);
  c.QK = mm32(c.Q, tr(c.K), dt);
  c.P = c.QK * c.Gamma;
  c.Qg = c.Q * c.eG.unsqueeze(-1);
  const at::Tensor Glast = c.G.narrow(-1, kChunk - 1, 1);
  c.Kd = c.K * (Glast - c.G).exp().unsqueeze(-1);
  c.gamma = Glast.exp();  // [NC, Hv, 1]
  const int64_t N = a.cu_seqlens.size(0) - 1;
  at::Tensor zero = at::zeros({1, a.v.size(1), a.q.size(2), a.v.size(2)}, a.q.options().dtype(wide));
  c.S0 = at::cat({a.initial_state.defined() ? a.initial_state.to(wide) : zero.expand({N, -1, -1, -1}), zero});
  return c;
}

// The forward scan: the state entering each chunk slot and each chunk's V' = U − W S.
struct Scan {
  at::Tensor S_in;  // [NC, Hv, Dk, Dv]
  at::Tensor Vn;    // [NC, Hv, C, Dv]
};

Scan scan(const Chunks& c, at::ScalarType dt) {
  Scan s;
  s.S_in = at::empty({c.l.NC, c.K.size(1), c.K.size(3), c.V.size(3)}, c.K.options());
  s.Vn = at::empty_like(c.V);
  at::Tensor S = at::zeros(s.S_in.sizes().slice(1), c.K.options());
  for (int64_t i = 0; i < c.l.NC; ++i) {
    // A sequence's first chunk starts from its initial state: a reset that needs no host branch.
    S = at::where(c.l.first.narrow(0, i, 1).view({1, 1, 1}), c.S0.index_select(0, c.l.seq.narrow(0, i, 1)).squeeze(0), S);
    s.S_in[i].copy_(S);
    at::Tensor vn = c.U[i] - mm32(c.W[i], S, dt);
    s.Vn[i].copy_(vn);
    S = c.gamma[i].unsqueeze(-1) * S + mm32(tr(c.Kd[i]), vn, dt);
  }
  return s;
}

class AtenLinearAttention final : public LinearAttention {
 protected:
  LinearAttentionResult run_forward(const LinearAttentionArgs& a) override {
    const auto dt = a.q.scalar_type();
    const int64_t T = a.q.size(0);
    const Chunks c = prepare(a, chunk_layout(a.cu_seqlens, T, kChunk));
    const Scan s = scan(c, dt);
    LinearAttentionResult r;
    at::Tensor O = mm32(c.Qg, s.S_in, dt) + mm32(c.P, s.Vn, dt);  // [NC, Hv, C, Dv]
    at::Tensor o = from_chunks(O, c.l);
    r.out = a.out.defined() ? a.out.copy_(o) : o.to(dt);
    if (a.output_final_state) {
      // The state after a sequence's last chunk; an empty sequence keeps its initial state.
      at::Tensor after = s.S_in * c.gamma.unsqueeze(-1) + mm32(tr(c.Kd), s.Vn, dt);
      const int64_t N = a.cu_seqlens.size(0) - 1;
      r.final_state = at::where(c.l.nonempty.view({N, 1, 1, 1}), after.index_select(0, c.l.last_chunk),
                                c.S0.narrow(0, 0, N));
    }
    return r;
  }

  LinearAttentionGrads run_backward(const LinearAttentionArgs& a, const LinearAttentionBackwardArgs& bw) override {
    const auto dt = a.q.scalar_type();
    const auto wide = gdr_wide_of(dt);
    const int64_t T = a.q.size(0), Hk = a.q.size(1), Hv = a.v.size(1), Dk = a.q.size(2);
    const int64_t N = a.cu_seqlens.size(0) - 1;
    const Chunks c = prepare(a, chunk_layout(a.cu_seqlens, T, kChunk));
    const ChunkLayout& l = c.l;
    const Scan s = scan(c, dt);
    const at::Tensor dO = to_chunks(bw.grad_out.to(wide), l);  // [NC, Hv, C, Dv]

    // The reverse scan: dS leaving each chunk (a sequence's last chunk takes grad_final_state) and dV'.
    at::Tensor zero = at::zeros({1, Hv, Dk, a.v.size(2)}, dO.options());
    at::Tensor GF = at::cat({bw.grad_final_state.defined() ? bw.grad_final_state.to(wide) : zero.expand({N, -1, -1, -1}), zero});
    const at::Tensor dVn_local = mm32(tr(c.P), dO, dt);   // Pᵀ dO
    const at::Tensor dS_local = mm32(tr(c.Qg), dO, dt);   // Q_gᵀ dO
    at::Tensor dS_out = at::empty_like(s.S_in), dS_in = at::empty_like(s.S_in), dVn = at::empty_like(s.Vn);
    at::Tensor dS = at::zeros(s.S_in.sizes().slice(1), dO.options());
    for (int64_t i = l.NC - 1; i >= 0; --i) {
      dS = at::where(l.last.narrow(0, i, 1).view({1, 1, 1}), GF.index_select(0, l.seq.narrow(0, i, 1)).squeeze(0), dS);
      dS_out[i].copy_(dS);
      at::Tensor dvn = dVn_local[i] + mm32(c.Kd[i], dS, dt);
      dVn[i].copy_(dvn);
      dS = dS_local[i] + c.gamma[i].unsqueeze(-1) * dS - mm32(tr(c.W[i]), dvn, dt);
      dS_in[i].copy_(dS);
    }

    // Chunk-parallel: through V' = U − W S_in, O = Q_g S_in + P V', S_out = γ S_in + K_dᵀ V'.
    const at::Tensor dQg = mm32(dO, tr(s.S_in), dt);
    const at::Tensor dW = -mm32(dVn, tr(s.S_in), dt);
    const at::Tensor dKd = mm32(s.Vn, tr(dS_out), dt);
    const at::Tensor dgamma = (s.S_in * dS_out).sum({-1, -2});  // [NC, Hv]
    const at::Tensor dP = mm32(dO, tr(s.Vn), dt);
    const at::Tensor& dU = dVn;
    // Through U = T (βV), W = T (βe^G K) and T = (I + L)⁻¹.
    const at::Tensor TmT = tr(c.Tm);
    const at::Tensor dT = mm32(dU, tr(c.Vb), dt) + mm32(dW, tr(c.Kbg), dt);
    const at::Tensor dVb = mm32(TmT, dU, dt), dKbg = mm32(TmT, dW, dt);
    const at::Tensor strict_lower = at::ones({kChunk, kChunk}, dO.options().dtype(at::kBool)).tril(-1);
    const at::Tensor dL = -at::matmul(at::matmul(TmT, dT), TmT) * strict_lower;  // fp32, as the solve
    // Through L = strict_lower(β_i KK_ij Γ_ij) and P = QK ∘ Γ.
    const at::Tensor bi = c.beta.unsqueeze(-1);
    const at::Tensor dKK = dL * bi * c.Gamma;
    const at::Tensor dQK = dP * c.Gamma;
    const at::Tensor dGamma = dL * bi * c.KK + dP * c.QK;
    const at::Tensor dKKs = dKK + tr(dKK);
    const at::Tensor rd = (c.G.narrow(-1, kChunk - 1, 1) - c.G).exp().unsqueeze(-1);  // e^{G_last − G}
    const at::Tensor beG = (c.beta * c.eG).unsqueeze(-1);
    at::Tensor dQ = mm32(dQK, c.K, dt) + c.eG.unsqueeze(-1) * dQg;
    at::Tensor dK = mm32(dKKs, c.K, dt) + mm32(tr(dQK), c.Q, dt) + rd * dKd + beG * dKbg;
    at::Tensor dV = dVb * c.beta.unsqueeze(-1);
    const at::Tensor kdkbg = (c.K * dKbg).sum(-1);  // [NC, Hv, C]
    at::Tensor dbeta = (dL * c.KK * c.Gamma).sum(-1) + (c.V * dVb).sum(-1) + c.eG * kdkbg;
    // Through G: Γ_ij = e^{G_i − G_j}, Q_g, K_d (e^{G_last − G_i}), γ = e^{G_last}, βe^G K.
    const at::Tensor E = dGamma * c.Gamma;
    const at::Tensor kd = (c.Kd * dKd).sum(-1);
    at::Tensor dG = E.sum(-1) - E.sum(-2) + (c.Qg * dQg).sum(-1) - kd + c.beta * c.eG * kdkbg;
    dG.narrow(-1, kChunk - 1, 1).add_(kd.sum(-1, /*keepdim=*/true) + c.gamma * dgamma.unsqueeze(-1));
    const at::Tensor dg = at::cumsum(dG.flip(-1), -1).flip(-1);  // G = cumsum(g)

    // Back to packed rows, through the head repeat (a sum over each group), the scale and the L2 norm.
    const int64_t group = Hv / Hk;
    at::Tensor dqhat = from_chunks(dQ, l).view({T, Hk, group, Dk}).sum(2) * c.scale;
    at::Tensor dkhat = from_chunks(dK, l).view({T, Hk, group, Dk}).sum(2);
    auto through_norm = [](const at::Tensor& dxh, const at::Tensor& xh, const at::Tensor& rstd) {
      return rstd.defined() ? rstd * (dxh - xh * (xh * dxh).sum(-1, /*keepdim=*/true)) : dxh;
    };
    LinearAttentionGrads g;
    g.dq = through_norm(dqhat, c.qhat, c.rq).to(dt);
    g.dk = through_norm(dkhat, c.khat, c.rk).to(dt);
    g.dv = from_chunks(dV, l).to(dt);
    g.dg = from_chunks(dg, l).to(a.g.scalar_type());
    g.dbeta = from_chunks(dbeta, l).to(dt);
    if (a.initial_state.defined())  // an empty sequence hands grad_final_state straight back
      g.dinitial_state = at::where(l.nonempty.view({N, 1, 1, 1}), dS_in.index_select(0, l.first_chunk), GF.narrow(0, 0, N))
                             .to(a.initial_state.scalar_type());
    return g;
  }
};

}  // namespace

std::shared_ptr<LinearAttention> make_aten_linear_attention() { return std::make_shared<AtenLinearAttention>(); }

}  // namespace ax::ops
