// The shared chunked gated delta rule (axengine/ops/linear_attention_chunked.hpp): the chunk-parallel math of
// the forward and of the hand-derived backward, around the backend's two scans. docs/ops/linear_attention.md,
// "Backends".
//
// Backward, given the scans' S_in, V', dS_out and dV' (chunk-parallel from there):
//   dU = dV', dW = −dV' S_inᵀ, dT = dU (βV)ᵀ + dW (βe^G K)ᵀ, dL = −Tᵀ dT Tᵀ (strictly lower),
// then the chain rule through L, P = (Q Kᵀ) ∘ Γ, Q_g = diag(e^G) Q, K_d, γ, Γ and G = cumsum(g) (dg is the
// reverse cumsum of dG).
//
// Packed sequences without a host sync: every sequence's chunks get slots in one padded [NC, C] layout
// (axengine/ops/linear_attention_chunks.hpp), padding rows carry β = g = 0 and zero q/k/v (they change nothing).
//
// Precision, as flash-linear-attention's kernels: every matmul operand is rounded to the compute dtype and
// accumulated in fp32 (gdr_mm); the state, the decays, the UT solve and everything elementwise are fp32.
#include "axengine/ops/linear_attention_chunked.hpp"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

namespace ax::ops {
namespace {

constexpr int64_t kGdrChunk = 64;
constexpr int64_t kGdrSolveBlock = 16;  // diagonal blocks solved row by row; larger ones by block doubling

at::ScalarType gdr_wide(at::ScalarType dt) { return dt == at::kDouble ? at::kDouble : at::kFloat; }
at::Tensor gdr_tr(const at::Tensor& t) { return t.transpose(-1, -2); }

// (I + L)⁻¹ for strictly lower L [.., n, n], in L's dtype. Blocks of kGdrSolveBlock by forward substitution
// (row i of R = T − I is A_i + A_i R with A = −L); larger ones from their halves,
// [[T11, 0], [T21, T22]] with T21 = −T22 L21 T11, both halves in one batch. ~50 launches for n = 64, not 200.
at::Tensor unit_lower_inverse(const at::Tensor& L) {
  const int64_t n = L.size(-1);
  if (n <= kGdrSolveBlock) {
    at::Tensor A = -L;
    at::Tensor R = A.clone();
    for (int64_t i = 1; i < n; ++i) {
      at::Tensor row = A.narrow(-2, i, 1).narrow(-1, 0, i);
      R.narrow(-2, i, 1).narrow(-1, 0, i).copy_(row + at::matmul(row, R.narrow(-2, 0, i).narrow(-1, 0, i)));
    }
    return R + at::eye(n, L.options());
  }
  const int64_t h = n / 2;
  const at::Tensor D = unit_lower_inverse(at::stack({L.narrow(-2, 0, h).narrow(-1, 0, h), L.narrow(-2, h, h).narrow(-1, h, h)}));
  const at::Tensor T11 = D[0], T22 = D[1];
  at::Tensor T = at::zeros_like(L);
  T.narrow(-2, 0, h).narrow(-1, 0, h).copy_(T11);
  T.narrow(-2, h, h).narrow(-1, h, h).copy_(T22);
  T.narrow(-2, h, h).narrow(-1, 0, h).copy_(-at::matmul(at::matmul(T22, L.narrow(-2, h, h).narrow(-1, 0, h)), T11));
  return T;
}

// Everything of the forward that does not depend on the state, chunk-parallel ([NC, Hv, C, ...]).
struct Chunks {
  ChunkLayout l;
  at::ScalarType dt = at::kFloat;
  at::Tensor qhat, khat, rq, rk;  // [T, Hk, Dk] normalised q/k and the norms' rstd (undefined without)
  double scale = 1.0;
  at::Tensor Q, K, V, beta, G;    // chunks; G = cumsum(g) inside each chunk
  at::Tensor Gamma, KK, QK, Tm;   // [NC, Hv, C, C]
  at::Tensor eG, Vb, Kbg, U, W, P, Qg, Kd, gamma;
  at::Tensor S0;                  // [N+1, Hv, Dk, Dv]: initial states, and zeros for padding slots
};

Chunks prepare(const LinearAttentionArgs& a) {
  const auto dt = a.q.scalar_type();
  const auto wide = gdr_wide(dt);
  Chunks c;
  c.l = chunk_layout(a.cu_seqlens, a.q.size(0), kGdrChunk);
  c.dt = dt;
  const ChunkLayout& l = c.l;
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
  const at::Tensor above = at::ones({kGdrChunk, kGdrChunk}, a.q.options().dtype(at::kBool)).triu(1);
  const at::Tensor on_or_above = at::ones({kGdrChunk, kGdrChunk}, a.q.options().dtype(at::kBool)).triu(0);
  // Γ: masked before the exp, so that G_i − G_j > 0 above the diagonal cannot overflow.
  c.Gamma = (c.G.unsqueeze(-1) - c.G.unsqueeze(-2)).masked_fill(above, -std::numeric_limits<double>::infinity()).exp();
  c.KK = gdr_mm(c.K, gdr_tr(c.K), dt);
  c.Tm = unit_lower_inverse((c.beta.unsqueeze(-1) * c.KK * c.Gamma).masked_fill(on_or_above, 0.0));
  c.eG = c.G.exp();
  c.Vb = c.V * c.beta.unsqueeze(-1);
  c.Kbg = c.K * (c.beta * c.eG).unsqueeze(-1);
  c.U = gdr_mm(c.Tm, c.Vb, dt);
  c.W = gdr_mm(c.Tm, c.Kbg, dt);
  c.QK = gdr_mm(c.Q, gdr_tr(c.K), dt);
  c.P = c.QK * c.Gamma;
  c.Qg = c.Q * c.eG.unsqueeze(-1);
  const at::Tensor Glast = c.G.narrow(-1, kGdrChunk - 1, 1);
  c.Kd = c.K * (Glast - c.G).exp().unsqueeze(-1);
  c.gamma = Glast.squeeze(-1).exp();  // [NC, Hv]
  const int64_t N = a.cu_seqlens.size(0) - 1;
  at::Tensor zero = at::zeros({1, a.v.size(1), a.q.size(2), a.v.size(2)}, a.q.options().dtype(wide));
  c.S0 = at::cat({a.initial_state.defined() ? a.initial_state.to(wide) : zero.expand({N, -1, -1, -1}), zero});
  return c;
}

GdrScanForward forward_scan(ChunkedLinearAttention* self, const Chunks& c,
                            void (ChunkedLinearAttention::*scan)(GdrScanForward&)) {
  GdrScanForward s;
  s.layout = &c.l;
  s.dtype = c.dt;
  s.U = c.U.contiguous(), s.W = c.W.contiguous(), s.Kd = c.Kd.contiguous(), s.gamma = c.gamma.contiguous();
  s.S0 = c.S0.contiguous();
  s.S_in = at::zeros({c.l.NC, c.K.size(1), c.K.size(3), c.V.size(3)}, c.K.options());
  s.Vn = at::zeros_like(c.V);
  (self->*scan)(s);
  return s;
}

}  // namespace

at::Tensor gdr_mm(const at::Tensor& a, const at::Tensor& b, at::ScalarType dt) {
  const auto wide = gdr_wide(dt);
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

LinearAttentionResult ChunkedLinearAttention::run_forward(const LinearAttentionArgs& a) {
  const auto dt = a.q.scalar_type();
  const Chunks c = prepare(a);
  const GdrScanForward s = forward_scan(this, c, &ChunkedLinearAttention::scan_forward);
  LinearAttentionResult r;
  at::Tensor O = gdr_mm(c.Qg, s.S_in, dt) + gdr_mm(c.P, s.Vn, dt);  // [NC, Hv, C, Dv]
  at::Tensor o = from_chunks(O, c.l);
  r.out = a.out.defined() ? a.out.copy_(o) : o.to(dt);
  if (a.output_final_state) {
    // The state after a sequence's last chunk; an empty sequence keeps its initial state.
    at::Tensor after = s.S_in * c.gamma.unsqueeze(-1).unsqueeze(-1) + gdr_mm(gdr_tr(c.Kd), s.Vn, dt);
    const int64_t N = a.cu_seqlens.size(0) - 1;
    r.final_state = at::where(c.l.nonempty.view({N, 1, 1, 1}), after.index_select(0, c.l.last_chunk), c.S0.narrow(0, 0, N));
  }
  return r;
}

LinearAttentionGrads ChunkedLinearAttention::run_backward(const LinearAttentionArgs& a, const LinearAttentionBackwardArgs& bw) {
  const auto dt = a.q.scalar_type();
  const auto wide = gdr_wide(dt);
  const int64_t T = a.q.size(0), Hk = a.q.size(1), Hv = a.v.size(1), Dk = a.q.size(2);
  const int64_t N = a.cu_seqlens.size(0) - 1;
  const Chunks c = prepare(a);
  const ChunkLayout& l = c.l;
  const GdrScanForward s = forward_scan(this, c, &ChunkedLinearAttention::scan_forward);
  const at::Tensor dO = to_chunks(bw.grad_out.to(wide), l);  // [NC, Hv, C, Dv]

  GdrScanBackward b;
  b.layout = &l;
  b.dtype = dt;
  b.W = s.W, b.Kd = s.Kd, b.gamma = s.gamma;
  b.dVn_local = gdr_mm(gdr_tr(c.P), dO, dt).contiguous();   // Pᵀ dO
  b.dS_local = gdr_mm(gdr_tr(c.Qg), dO, dt).contiguous();   // Q_gᵀ dO
  at::Tensor zero = at::zeros({1, Hv, Dk, a.v.size(2)}, dO.options());
  b.GF = at::cat({bw.grad_final_state.defined() ? bw.grad_final_state.to(wide) : zero.expand({N, -1, -1, -1}), zero}).contiguous();
  b.dS_out = at::zeros_like(s.S_in), b.dS_in = at::zeros_like(s.S_in), b.dVn = at::zeros_like(s.Vn);
  scan_backward(b);
  const at::Tensor &dS_out = b.dS_out, &dS_in = b.dS_in, &dVn = b.dVn;

  // Chunk-parallel: through V' = U − W S_in, O = Q_g S_in + P V', S_out = γ S_in + K_dᵀ V'.
  const at::Tensor dQg = gdr_mm(dO, gdr_tr(s.S_in), dt);
  const at::Tensor dW = -gdr_mm(dVn, gdr_tr(s.S_in), dt);
  const at::Tensor dKd = gdr_mm(s.Vn, gdr_tr(dS_out), dt);
  const at::Tensor dgamma = (s.S_in * dS_out).sum({-1, -2});  // [NC, Hv]
  const at::Tensor dP = gdr_mm(dO, gdr_tr(s.Vn), dt);
  const at::Tensor& dU = dVn;
  // Through U = T (βV), W = T (βe^G K) and T = (I + L)⁻¹.
  const at::Tensor TmT = gdr_tr(c.Tm);
  const at::Tensor dT = gdr_mm(dU, gdr_tr(c.Vb), dt) + gdr_mm(dW, gdr_tr(c.Kbg), dt);
  const at::Tensor dVb = gdr_mm(TmT, dU, dt), dKbg = gdr_mm(TmT, dW, dt);
  const at::Tensor strict_lower = at::ones({kGdrChunk, kGdrChunk}, dO.options().dtype(at::kBool)).tril(-1);
  const at::Tensor dL = -at::matmul(at::matmul(TmT, dT), TmT) * strict_lower;  // fp32, as the solve
  // Through L = strict_lower(β_i KK_ij Γ_ij) and P = QK ∘ Γ.
  const at::Tensor bi = c.beta.unsqueeze(-1);
  const at::Tensor dKK = dL * bi * c.Gamma;
  const at::Tensor dQK = dP * c.Gamma;
  const at::Tensor dGamma = dL * bi * c.KK + dP * c.QK;
  const at::Tensor dKKs = dKK + gdr_tr(dKK);
  const at::Tensor rd = (c.G.narrow(-1, kGdrChunk - 1, 1) - c.G).exp().unsqueeze(-1);  // e^{G_last − G}
  const at::Tensor beG = (c.beta * c.eG).unsqueeze(-1);
  at::Tensor dQ = gdr_mm(dQK, c.K, dt) + c.eG.unsqueeze(-1) * dQg;
  at::Tensor dK = gdr_mm(dKKs, c.K, dt) + gdr_mm(gdr_tr(dQK), c.Q, dt) + rd * dKd + beG * dKbg;
  at::Tensor dV = dVb * c.beta.unsqueeze(-1);
  const at::Tensor kdkbg = (c.K * dKbg).sum(-1);  // [NC, Hv, C]
  at::Tensor dbeta = (dL * c.KK * c.Gamma).sum(-1) + (c.V * dVb).sum(-1) + c.eG * kdkbg;
  // Through G: Γ_ij = e^{G_i − G_j}, Q_g, K_d (e^{G_last − G_i}), γ = e^{G_last}, βe^G K.
  const at::Tensor E = dGamma * c.Gamma;
  const at::Tensor kd = (c.Kd * dKd).sum(-1);
  at::Tensor dG = E.sum(-1) - E.sum(-2) + (c.Qg * dQg).sum(-1) - kd + c.beta * c.eG * kdkbg;
  dG.narrow(-1, kGdrChunk - 1, 1).add_(kd.sum(-1, /*keepdim=*/true) + (c.gamma * dgamma).unsqueeze(-1));
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
    g.dinitial_state = at::where(l.nonempty.view({N, 1, 1, 1}), dS_in.index_select(0, l.first_chunk), b.GF.narrow(0, 0, N))
                           .to(a.initial_state.scalar_type());
  return g;
}

}  // namespace ax::ops
