// The host side of the gdn linear_attention backend: ATen lays the rows out in chunks (the shared layout of
// axengine/ops/linear_attention_chunks.hpp), normalises and scales q/k, repeats them to the value heads and
// takes cumsum(g), all in fp32; the five kernels do the chunked math (kernels/chunk_math.cuh); ATen turns
// dG into dg (a reverse cumsum), gathers the rows back, sums dq/dk over each group and goes back through
// the scale and the L2 norm. No host sync (the layout is built on the device, every grid size comes from
// shapes): graph-safe. Deterministic: gathers, fixed-order loops, no atomics.
#include "linear_attention.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include <axengine/ops/linear_attention_chunks.hpp>
#include <axengine/strings.hpp>

namespace ax::gdn {
namespace {

using ops::LinearAttentionArgs;

// The fp32 chunked inputs of both passes.
struct Inputs {
  ops::ChunkLayout l;
  at::Tensor qhat, khat, rq, rk;  // [T, Hk, Dk] normalised q/k and the norms' rstd (undefined without the norm)
  double scale = 1.0;
  at::Tensor Q, K, V, beta, G, S0;
};

Inputs prepare(const LinearAttentionArgs& a) {
  Inputs in;
  const int64_t T = a.q.size(0);
  in.l = ops::chunk_layout(a.cu_seqlens, T, kChunk);
  in.scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(a.q.size(2)));
  in.qhat = a.q.to(at::kFloat);
  in.khat = a.k.to(at::kFloat);
  if (a.qk_l2norm) {
    in.rq = at::rsqrt(in.qhat.square().sum(-1, /*keepdim=*/true).add_(ops::kLinearAttentionL2Eps));
    in.rk = at::rsqrt(in.khat.square().sum(-1, /*keepdim=*/true).add_(ops::kLinearAttentionL2Eps));
    in.qhat = in.qhat * in.rq;
    in.khat = in.khat * in.rk;
  }
  const int64_t group = a.v.size(1) / a.q.size(1);
  in.Q = ops::to_chunks(in.qhat.repeat_interleave(group, 1) * in.scale, in.l);
  in.K = ops::to_chunks(in.khat.repeat_interleave(group, 1), in.l);
  in.V = ops::to_chunks(a.v.to(at::kFloat), in.l);
  in.beta = ops::to_chunks(a.beta.to(at::kFloat), in.l);
  in.G = at::cumsum(ops::to_chunks(a.g.to(at::kFloat), in.l), -1).contiguous();
  if (a.initial_state.defined()) in.S0 = a.initial_state.to(at::kFloat).contiguous();
  return in;
}

const float* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
float* mut(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// The forward's workspaces and the Params over them.
struct Forward {
  at::Tensor Tm, P, U, W, S_in, Vn;
  Params p;
};

Forward forward_pass(const Kernels& k, const Inputs& in, const LinearAttentionArgs& a, void* stream,
                     const at::Tensor& final_state) {
  const int64_t NC = in.l.NC, H = a.v.size(1), Dk = a.q.size(2), Dv = a.v.size(2), C = kChunk;
  const auto f32 = a.q.options().dtype(at::kFloat);
  Forward f;
  f.Tm = at::empty({NC, H, C, C}, f32);
  f.P = at::empty({NC, H, C, C}, f32);
  f.U = at::empty({NC, H, C, Dv}, f32);
  f.W = at::empty({NC, H, C, Dk}, f32);
  // Slots past the last chunk are no sequence's: the scans never write them; zeros keep their (discarded)
  // outputs finite.
  f.S_in = at::zeros({NC, H, Dk, Dv}, f32);
  f.Vn = at::zeros({NC, H, C, Dv}, f32);
  Params& p = f.p;
  p.NC = NC;
  p.N = a.cu_seqlens.size(0) - 1;
  p.H = static_cast<int>(H);
  p.Dk = static_cast<int>(Dk);
  p.Dv = static_cast<int>(Dv);
  p.chunk_begin = in.l.chunk_begin.data_ptr<int64_t>();
  p.Q = ptr(in.Q), p.K = ptr(in.K), p.V = ptr(in.V), p.beta = ptr(in.beta), p.G = ptr(in.G), p.S0 = ptr(in.S0);
  p.Tm = mut(f.Tm), p.P = mut(f.P), p.U = mut(f.U), p.W = mut(f.W), p.S_in = mut(f.S_in), p.Vn = mut(f.Vn);
  p.final_state = mut(final_state);
  k.ut_transform(p, stream);
  k.scan_forward(p, stream);
  return f;
}

// dx from dx̂ through x̂ = x·rstd (or dx̂ itself without the norm).
at::Tensor through_norm(const at::Tensor& dxh, const at::Tensor& xh, const at::Tensor& rstd) {
  return rstd.defined() ? rstd * (dxh - xh * (xh * dxh).sum(-1, /*keepdim=*/true)) : dxh;
}

class GdnLinearAttention final : public ops::LinearAttention {
 public:
  explicit GdnLinearAttention(const Kernels& k) : k_(k) {}

  std::optional<std::string> decline(const LinearAttentionArgs& a) const override {
    if (a.q.size(2) > kMaxKeyDim) return str("key head dim ", a.q.size(2), " > ", kMaxKeyDim, " (the scan's shared memory)");
    if (a.q.scalar_type() == at::kDouble) return std::string("fp64 (the kernels compute in fp32)");
    return std::nullopt;
  }

 protected:
  ops::LinearAttentionResult run_forward(const LinearAttentionArgs& a) override {
    void* stream = stream_of(a.q);
    const Inputs in = prepare(a);
    const int64_t N = a.cu_seqlens.size(0) - 1;
    ops::LinearAttentionResult r;
    if (a.output_final_state) r.final_state = at::empty({N, a.v.size(1), a.q.size(2), a.v.size(2)}, a.q.options().dtype(at::kFloat));
    Forward f = forward_pass(k_, in, a, stream, r.final_state);
    at::Tensor O = at::empty_like(f.U);
    f.p.O = mut(O);
    k_.output_forward(f.p, stream);
    at::Tensor o = ops::from_chunks(O, in.l);
    r.out = a.out.defined() ? a.out.copy_(o) : o.to(a.q.scalar_type());
    return r;
  }

  ops::LinearAttentionGrads run_backward(const LinearAttentionArgs& a, const ops::LinearAttentionBackwardArgs& b) override {
    void* stream = stream_of(a.q);
    const Inputs in = prepare(a);
    const int64_t T = a.q.size(0), Hk = a.q.size(1), H = a.v.size(1), Dk = a.q.size(2);
    Forward f = forward_pass(k_, in, a, stream, at::Tensor());
    const at::Tensor dO = ops::to_chunks(b.grad_out.to(at::kFloat), in.l);
    const at::Tensor dSf = b.grad_final_state.defined() ? b.grad_final_state.to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor dS_out = at::zeros_like(f.S_in), dVn = at::zeros_like(f.Vn);
    at::Tensor dS0 = a.initial_state.defined() ? at::empty_like(in.S0) : at::Tensor();
    at::Tensor dQg = at::empty_like(f.W), dW = at::empty_like(f.W), dKd = at::empty_like(f.W), dKbg = at::empty_like(f.W);
    at::Tensor dQ = at::empty_like(f.W), dK = at::empty_like(f.W), dV = at::empty_like(f.U);
    at::Tensor dbeta = at::empty_like(in.beta), dG = at::empty_like(in.G);
    Params& p = f.p;
    p.dO = ptr(dO), p.dSf = ptr(dSf), p.dS_out = mut(dS_out), p.dVn = mut(dVn), p.dS0 = mut(dS0);
    p.dQg = mut(dQg), p.dW = mut(dW), p.dKd = mut(dKd), p.dKbg = mut(dKbg);
    p.dQ = mut(dQ), p.dK = mut(dK), p.dV = mut(dV), p.dbeta = mut(dbeta), p.dG = mut(dG);
    k_.scan_backward(p, stream);
    k_.chunk_backward(p, stream);

    const int64_t group = H / Hk;
    at::Tensor dqhat = ops::from_chunks(dQ, in.l).view({T, Hk, group, Dk}).sum(2) * in.scale;
    at::Tensor dkhat = ops::from_chunks(dK, in.l).view({T, Hk, group, Dk}).sum(2);
    const at::Tensor dg = at::cumsum(dG.flip(-1), -1).flip(-1);  // G = cumsum(g) inside each chunk
    ops::LinearAttentionGrads g;
    const auto dt = a.q.scalar_type();
    g.dq = through_norm(dqhat, in.qhat, in.rq).to(dt);
    g.dk = through_norm(dkhat, in.khat, in.rk).to(dt);
    g.dv = ops::from_chunks(dV, in.l).to(dt);
    g.dg = ops::from_chunks(dg, in.l).to(a.g.scalar_type());
    g.dbeta = ops::from_chunks(dbeta, in.l).to(dt);
    if (dS0.defined()) g.dinitial_state = dS0.to(a.initial_state.scalar_type());
    return g;
  }

 private:
  void* stream_of(const at::Tensor& t) const {
    if (!t.is_cuda()) return nullptr;  // the host kernels (tests)
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
  }

  const Kernels& k_;
};

}  // namespace

std::shared_ptr<ops::LinearAttention> make_linear_attention(const Kernels& kernels) {
  return std::make_shared<GdnLinearAttention>(kernels);
}

}  // namespace ax::gdn
