// The sonicmoe moe.mlp block: ATen orchestration around the kernels of ../kernels/gather_gemm.hpp.
//
// Forward (rows in expert-sorted order m; t(m) its token, e(m) its expert, g_m its routing weight):
//   XA   = s1 · X · A1_catᵀ  [T, E·r1]  one dense GEMM; row m's LoRA input is the slice (t(m), e(m))
//   h    = act(gather(X) · W1_e + b1_e + XA_m · B1_eᵀ)   glu kernel: gather in the A loads, LoRA as one
//                                                       extra K tile, GLU in the epilogue -> h [M, I]
//                                                       and u [M, 2I] from one GEMM
//   HA   = s2 · h · A2_eᵀ    [M, r2]   at::_grouped_mm
//   Y_m  = h · W2_e + b2_e + HA_m · B2_eᵀ                store kernel (no gather), rows in sorted order
//   y_t  = Σ_j g · Y_(t,j)                               combine kernel, through the inverse permutation
//   saved: u [M, 2I], s1·XA rows [M, r1], HA [M, r2]. Keeping u costs M·2I (T·k·2I: constant in the
//          expert granularity at fixed active FLOPs) and saves the backward a whole gate_up GEMM (the
//          first version recomputed it: ~15 % of the block's time at qwen3-30b-a3b); h [M, I] is not kept:
//          the dglu epilogue rewrites it from u where the down LoRA's dA2 reads it.
// Backward (G = dY [T, H]):
//   GB   = G · B2_cat        [T, E·r2]  dense; row m's slice (t(m), e(m))
//   dH'  = gather(G) · W2_eᵀ + s2 · GB_m · A2_e          dglu kernel: gather in the A loads; epilogue:
//   du   = act'(u) ⊙ g_m · dH'  [M, 2I]                 dGLU, and the router-score gradient
//   dg_m = Σ_j dH'_mj · h_mj  (+ G_t · b2_e)            rowsum(dH' ⊙ act(u)), partial per column tile
//   h    = act(u)  [M, I]                               (written by the same epilogue when dA2 needs it)
//   DB   = s1 · du · B1_e    [M, r1]   at::_grouped_mm
//   dX_m = du · W1_eᵀ + DB_m · A1_e                      store kernel; dx_t = Σ_j dX_(t,j)
//   dB1_e = du_eᵀ · (s1·XA)_e, dA2_e = (s2·g·GB)_eᵀ · h_e   at::_grouped_mm over K groups
//   dA1 = Z1ᵀ · X, dB2 = Gᵀ · Z2   dense: Z [T, E·r] holds row m's thin product at (t(m), e(m)) (a token
//                                  has at most one entry per expert), so no [M, H] gather is formed
// LoRA ranks are zero-padded to a multiple of 8 (TMA rows of 16 bytes); padding adds exact zeros.
#include <ATen/ATen.h>
#ifndef AXENGINE_SONICMOE_HOST_EMULATION
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "../kernels/combine.hpp"
#include "../kernels/gather_gemm.hpp"
#include "sonicmoe.hpp"

namespace ax::sonicmoe {
namespace {

using ops::MoeMlpArgs;

int64_t pad8(int64_t r) { return (r + 7) / 8 * 8; }

// Row-major with 16-byte aligned rows, as TMA and cp.async read it (copies only when it is not).
at::Tensor rows16(const at::Tensor& t) {
  const bool ok = t.dim() == 2 && t.stride(1) == 1 && t.stride(0) % 8 == 0 &&
                  (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15u) == 0;
  return ok ? t : t.contiguous();
}
at::Tensor dense16(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return (reinterpret_cast<uintptr_t>(c.data_ptr()) & 15u) == 0 ? c : c.clone();
}

// lora a [r·E, K] -> [E·rp, K] and b [N, r·E] -> [N, E·rp], each expert's rank zero-padded to rp.
at::Tensor pad_a(const at::Tensor& a, int64_t E, int64_t r, int64_t rp) {
  if (rp == r) return dense16(a);
  at::Tensor z = at::zeros({E, rp, a.size(1)}, a.options());
  z.narrow(1, 0, r).copy_(a.reshape({E, r, a.size(1)}));
  return z.view({E * rp, a.size(1)});
}
at::Tensor pad_b(const at::Tensor& b, int64_t E, int64_t r, int64_t rp) {
  if (rp == r) return dense16(b);
  at::Tensor z = at::zeros({b.size(0), E, rp}, b.options());
  z.narrow(2, 0, r).copy_(b.reshape({b.size(0), E, r}));
  return z.view({b.size(0), E * rp});
}
at::Tensor unpad_a(const at::Tensor& da, int64_t E, int64_t r, int64_t rp) {
  return rp == r ? da : da.view({E, rp, da.size(1)}).narrow(1, 0, r).reshape({E * r, da.size(1)});
}
at::Tensor unpad_b(const at::Tensor& db, int64_t E, int64_t r, int64_t rp) {
  return rp == r ? db : db.view({db.size(0), E, rp}).narrow(2, 0, r).reshape({db.size(0), E * r});
}

// AXENGINE_SONICMOE_HOST_EMULATION: the CPU test build (tests/sonicmoe_emulation_test.cpp), where the
// kernels are replaced by a host emulation of gather_gemm.hpp's semantics and tensors live on the CPU.
#ifdef AXENGINE_SONICMOE_HOST_EMULATION
struct DeviceScope {
  explicit DeviceScope(const at::Device&) {}
};
cudaStream_t stream_of(const at::Tensor&) { return nullptr; }
void check(const char* why, const char* what) {
  if (why != nullptr) throw RuntimeError(str("moe.mlp[sonicmoe]: ", what, ": ", why));
}
#else
using DeviceScope = c10::cuda::CUDAGuard;
cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }
void check(const char* why, const char* what) {
  if (why != nullptr) throw RuntimeError(str("moe.mlp[sonicmoe]: ", what, ": ", why));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw RuntimeError(str("moe.mlp[sonicmoe]: ", what, ": ", cudaGetErrorString(e)));
}
#endif

// Everything derived from the routing and shapes, on the device (no host synchronisation).
struct Prep {
  ops::MoeMlpDims d;
  int64_t r1 = 0, r2 = 0, rp1 = 0, rp2 = 0;
  at::Tensor seg;     // [E + 1] int64
  at::Tensor expert;  // [M] int64, -1 inactive
  at::Tensor scat;    // [M] int64
  at::Tensor scat_in; // [M] int64: scat, inactive rows at 0 (an index they may read)
  at::Tensor active;  // [M] bool
  at::Tensor slot;    // [M] int64: t(m)·E + e(m) (active), T·E (inactive: a dummy row)
  at::Tensor slot_in; // [M] int64: slot, inactive rows at T·E - 1 (a row they read and mask_rows zeroes)
  at::Tensor inv;     // [T·k] int64: scattered entry -> sorted row, -1 inactive
  at::Tensor offs;    // [E] int32 cumulative ends (_grouped_mm)
  at::Tensor x;       // [T, H] rows16
  at::Tensor w1, w2;  // dense, contiguous
  bool ekn = false;
  cudaStream_t stream = nullptr;
};

Prep prepare(const MoeMlpArgs& a) {
  Prep p;
  p.d = ops::moe_mlp_dims(a);
  const auto& d = p.d;
  if (a.gate_up_lora.defined()) p.r1 = a.gate_up_lora.a.size(0) / d.E, p.rp1 = pad8(p.r1);
  if (a.down_lora.defined()) p.r2 = a.down_lora.a.size(0) / d.E, p.rp2 = pad8(p.r2);
  p.x = rows16(a.x);
  p.stream = stream_of(p.x);
  const auto lopt = p.x.options().dtype(at::kLong);
  p.expert = a.routing.sorted_expert_idxs.contiguous();
  p.scat = a.routing.sorted_scattered_idxs.contiguous();
  const at::Tensor ends = a.routing.expert_offsets.to(at::kLong).contiguous();
  p.seg = at::constant_pad_nd(ends, {1, 0}, 0);
  p.offs = ends.to(at::kInt);
  p.active = p.expert.ge(0);
  p.scat_in = at::where(p.active, p.scat, 0);  // inactive entries' scattered indices are ignored (any value)
  const at::Tensor tok = p.scat_in.div(d.k, "floor");
  p.slot = at::where(p.active, tok * d.E + p.expert, d.T * d.E);
  p.slot_in = p.slot.clamp_max(d.T * d.E - 1);
  at::Tensor inv = at::full({d.M + 1}, -1, lopt);
  inv.scatter_(0, at::where(p.active, p.scat, d.M), at::arange(d.M, lopt));  // slot M: discarded
  p.inv = inv.narrow(0, 0, d.M);
  p.w1 = dense16(a.gate_up.values);
  p.w2 = dense16(a.down.values);
  p.ekn = a.layout == ops::ExpertLayout::EKN;
  return p;
}

GatherGemmArgs base_args(const Prep& p) {
  GatherGemmArgs g;
  g.E = static_cast<int>(p.d.E);
  g.M = p.d.M;
  g.seg = p.seg.data_ptr<int64_t>();
  g.row_expert = p.expert.data_ptr<int64_t>();
  return g;
}

at::Tensor mask_rows(const Prep& p, const at::Tensor& t) { return at::where(p.active.unsqueeze(1), t, 0); }
// Row m's slice (t(m), e(m)) of a per-token thin product [T, E·rp] (inactive rows: zeros).
at::Tensor slice_rows(const Prep& p, const at::Tensor& all, int64_t rp) {
  return mask_rows(p, all.reshape({p.d.T * p.d.E, rp}).index_select(0, p.slot_in));
}
// The inverse: Z [T, E·rp] with row m's values at (t(m), e(m)), zeros elsewhere (unique slots).
at::Tensor spread_rows(const Prep& p, const at::Tensor& rows, int64_t rp) {
  const int64_t TE = p.d.T * p.d.E;
  at::Tensor z = at::zeros({TE + 1, rp}, rows.options());
  z.index_copy_(0, p.slot, rows);  // inactive rows all land in the dummy row TE, which is dropped
  return z.narrow(0, 0, TE).view({p.d.T, p.d.E * rp});
}

// h = act(u) [M, I] and u [M, 2I] of the gate_up projection (glu kernel; one GEMM writes both).
struct GateUp {
  at::Tensor h, u;
};
GateUp gate_up(const MoeMlpArgs& a, const Prep& p, const at::Tensor& xa_rows, const at::Tensor& b1p) {
  const auto& d = p.d;
  GateUp r{at::empty({d.M, d.I}, p.x.options()), at::empty({d.M, 2 * d.I}, p.x.options())};
  at::Tensor bias;
  GatherGemmArgs g = base_args(p);
  g.epi = Epi::glu;
  g.a = p.x.data_ptr();
  g.lda = p.x.stride(0);
  g.a_idx = p.scat.data_ptr<int64_t>();
  g.a_div = static_cast<int>(d.k);
  g.K = static_cast<int>(d.H);
  g.w = p.w1.data_ptr();
  g.w_kmajor = !p.ekn;  // ENK [E, 2I, H]: rows of u columns along H
  g.ldw = p.ekn ? 2 * d.I : d.H;
  g.N = static_cast<int>(2 * d.I);
  if (p.rp1 > 0) {
    g.r = static_cast<int>(p.rp1);
    g.a2 = xa_rows.data_ptr();
    g.w2 = b1p.data_ptr();
    g.w2_kmajor = true;
    g.ldw2 = b1p.stride(0);
  }
  if (a.gate_up_bias.defined()) {
    bias = dense16(a.gate_up_bias.to(p.x.scalar_type()));
    g.bias = bias.data_ptr();
    g.bias_estride = bias.stride(0);
  }
  g.out = r.h.data_ptr();
  g.ldo = r.h.stride(0);
  g.u_out = r.u.data_ptr();
  g.ldu_out = r.u.stride(0);
  g.interleaved = a.packing == ops::GluPacking::interleaved;
  g.clamped = a.activation == ops::MoeActivation::clamped_glu;
  g.alpha = static_cast<float>(a.alpha);
  g.limit = static_cast<float>(a.limit);
  check(launch_gather_gemm(g, p.stream), "gate_up GEMM");
  return r;
}

// out[m] = A_m · W_e (+ bias_e) + a2_m · B2_e for sorted rows (store kernel, no gather).
void store_gemm(const Prep& p, const at::Tensor& a_rows, const at::Tensor& w, bool w_kmajor, int64_t ldw, int64_t N,
                const at::Tensor& a2, const at::Tensor& w2, bool w2_kmajor, const at::Tensor& bias, const at::Tensor& out,
                const char* what) {
  GatherGemmArgs g = base_args(p);
  g.epi = Epi::store;
  g.a = a_rows.data_ptr();
  g.lda = a_rows.stride(0);
  g.K = static_cast<int>(a_rows.size(1));
  g.w = w.data_ptr();
  g.w_kmajor = w_kmajor;
  g.ldw = ldw;
  g.N = static_cast<int>(N);
  if (a2.defined()) {
    g.r = static_cast<int>(a2.size(1));
    g.a2 = a2.data_ptr();
    g.w2 = w2.data_ptr();
    g.w2_kmajor = w2_kmajor;
    g.ldw2 = w2.stride(0);
  }
  if (bias.defined()) {
    g.bias = bias.data_ptr();
    g.bias_estride = bias.stride(0);
  }
  g.out = out.data_ptr();
  g.ldo = out.stride(0);
  check(launch_gather_gemm(g, p.stream), what);
}

// y_t = Σ_j w_tj · rows[inv[t·k + j]] (inactive entries contribute nothing; w undefined: weight 1).
at::Tensor combine(const Prep& p, const at::Tensor& rows, const at::Tensor& w) {
  const auto& d = p.d;
  at::Tensor y = at::empty({d.T, rows.size(1)}, rows.options());
  CombineArgs c;
  c.T = d.T;
  c.k = static_cast<int>(d.k);
  c.N = static_cast<int>(rows.size(1));
  c.rows = rows.data_ptr();
  c.ld_rows = rows.stride(0);
  c.inv = p.inv.data_ptr<int64_t>();
  c.gates = w.defined() ? w.data_ptr() : nullptr;
  c.y = y.data_ptr();
  c.ld_y = y.stride(0);
  check(launch_combine(c, p.stream), "combine");
  return y;
}

at::Tensor assign(const at::Tensor& out, const at::Tensor& value) {
  if (!out.defined()) return value;
  out.copy_(value);
  return out;
}

// Experts with no rows get exact zeros from the K-grouped products ([E, a, b]).
at::Tensor zero_empty(const Prep& p, const at::Tensor& t) {
  const at::Tensor nonempty = (p.seg.narrow(0, 1, p.d.E) - p.seg.narrow(0, 0, p.d.E)).gt(0).view({p.d.E, 1, 1});
  return at::where(nonempty, t, 0);
}

class SonicMoe final : public ops::MoeMlp {
 public:
  std::optional<std::string> decline(const MoeMlpArgs& args) const override { return decline_reason(args); }

 protected:
  ops::MoeMlpResult run_forward(const MoeMlpArgs& a) override {
    require_served(a);
    DeviceScope guard(a.x.device());
    const Prep p = prepare(a);
    const auto& d = p.d;
    at::Tensor xa_rows, b1p, ha_rows;
    if (p.rp1 > 0) {  // s1 · XA rows: one dense GEMM over the tokens, then each row's expert slice
      const at::Tensor a1p = pad_a(a.gate_up_lora.a, d.E, p.r1, p.rp1);
      b1p = pad_b(a.gate_up_lora.b, d.E, p.r1, p.rp1);
      const at::Tensor xa_all = at::mm(p.x, a1p.t());
      xa_rows = slice_rows(p, xa_all, p.rp1).mul_(a.gate_up_lora.scaling).contiguous();
    }
    const auto [h, u] = gate_up(a, p, xa_rows, b1p);
    at::Tensor b2p;
    if (p.rp2 > 0) {  // s2 · h · A2_eᵀ, the down projection's LoRA input
      const at::Tensor a2p = pad_a(a.down_lora.a, d.E, p.r2, p.rp2);
      b2p = pad_b(a.down_lora.b, d.E, p.r2, p.rp2);
      ha_rows = at::_grouped_mm(h, a2p.view({d.E, p.rp2, d.I}).transpose(1, 2), p.offs);
      ha_rows = mask_rows(p, ha_rows).mul_(a.down_lora.scaling).contiguous();
    }
    at::Tensor bias2;
    if (a.down_bias.defined()) bias2 = dense16(a.down_bias.to(p.x.scalar_type()));
    at::Tensor y_rows = at::empty({d.M, d.H}, p.x.options());
    // W2 as [K = I, N = H]: ENK [E, H, I] is K-major, EKN [E, I, H] MN-major.
    store_gemm(p, h, p.w2, !p.ekn, p.ekn ? d.H : d.I, d.H, ha_rows, b2p, true, bias2, y_rows, "down GEMM");
    ops::MoeMlpResult r;
    r.y = assign(a.out, combine(p, y_rows, a.gates.to(p.x.scalar_type()).contiguous()));
    // u for the backward's dGLU (h is recomputed from it there, where the down LoRA's dA2 needs it).
    r.saved = {u, xa_rows, ha_rows};
    return r;
  }

  ops::MoeMlpGrads run_backward(const MoeMlpArgs& a, const ops::MoeMlpBackwardArgs& b) override {
    require_served(a);
    if (b.saved.size() != 3) throw UsageError("moe.mlp: saved: not the saved tensors of sonicmoe's forward");
    DeviceScope guard(a.x.device());
    const Prep p = prepare(a);
    const auto& d = p.d;
    const at::Tensor& u = b.saved[0];
    const at::Tensor& xa_rows = b.saved[1];
    const at::Tensor& ha_rows = b.saved[2];
    const at::Tensor gy = rows16(b.grad_y.to(p.x.scalar_type()));
    const auto xdt = p.x.scalar_type();
    ops::MoeMlpGrads g;
    const bool lora1 = p.rp1 > 0, lora2 = p.rp2 > 0;
    const bool need_up = b.need_dx || (b.need_dlora && lora1);
    const bool need_da2 = b.need_dlora && lora2;  // reads h, which the dglu kernel rewrites from u
    const bool need_dh = need_up || b.need_dgates || need_da2;
    const at::Tensor gates = a.gates.to(xdt).contiguous();
    const at::Tensor g_rows = mask_rows(p, gates.view({-1}).index_select(0, p.scat_in).unsqueeze(1))
                                  .view({d.M});

    at::Tensor gb_rows;  // GB rows [M, rp2]: G_t(m) · B2_e(m), unscaled, ungated
    if (lora2 && (need_dh || b.need_dlora)) {
      const at::Tensor b2p = pad_b(a.down_lora.b, d.E, p.r2, p.rp2);
      gb_rows = slice_rows(p, at::mm(gy, b2p), p.rp2);
    }

    at::Tensor du, h;
    if (need_dh) {
      du = at::empty({d.M, 2 * d.I}, p.x.options());
      const at::Tensor scale = g_rows.to(at::kFloat).contiguous();
      GatherGemmArgs k = base_args(p);
      k.epi = Epi::dglu;
      k.a = gy.data_ptr();
      k.lda = gy.stride(0);
      k.a_idx = p.scat.data_ptr<int64_t>();
      k.a_div = static_cast<int>(d.k);
      k.K = static_cast<int>(d.H);
      k.w = p.w2.data_ptr();  // W2_eᵀ as [K = H, N = I]: EKN [E, I, H] is K-major, ENK [E, H, I] MN-major
      k.w_kmajor = p.ekn;
      k.ldw = p.ekn ? d.H : d.I;
      k.N = static_cast<int>(d.I);
      at::Tensor a2, sgb;
      if (lora2) {
        sgb = (gb_rows * a.down_lora.scaling).contiguous();
        a2 = pad_a(a.down_lora.a, d.E, p.r2, p.rp2);  // [E·rp2, I]: MN-major B2
        k.r = static_cast<int>(p.rp2);
        k.a2 = sgb.data_ptr();
        k.w2 = a2.data_ptr();
        k.w2_kmajor = false;
        k.ldw2 = a2.stride(0);
      }
      k.out = du.data_ptr();
      k.ldo = du.stride(0);
      k.interleaved = a.packing == ops::GluPacking::interleaved;
      k.clamped = a.activation == ops::MoeActivation::clamped_glu;
      k.alpha = static_cast<float>(a.alpha);
      k.limit = static_cast<float>(a.limit);
      k.u = u.data_ptr();
      k.ldu = u.stride(0);
      if (need_da2) {
        h = at::empty({d.M, d.I}, p.x.options());
        k.h_out = h.data_ptr();
        k.ldh_out = h.stride(0);
      }
      k.row_scale = scale.data_ptr<float>();
      const int tiles = gather_gemm_col_tiles(k);
      at::Tensor rowsum = at::empty({d.M, tiles}, p.x.options().dtype(at::kFloat));
      k.rowsum = rowsum.data_ptr<float>();
      k.ld_rowsum = tiles;
      check(launch_gather_gemm(k, p.stream), "backward dH GEMM");
      if (b.need_dgates) {  // dgates[t, j] = <dY_t, h W2_e + LoRA> + <dY_t, b2_e>
        at::Tensor dg = mask_rows(p, rowsum.sum(1, /*keepdim=*/true));
        if (a.down_bias.defined()) {
          const at::Tensor gb2 = at::mm(gy.to(at::kFloat), a.down_bias.to(at::kFloat).t());  // [T, E]
          dg = dg + mask_rows(p, slice_rows(p, gb2, 1));
        }
        at::Tensor flat = dg.index_select(0, p.inv.clamp_min(0)).view({d.T * d.k});
        flat = at::where(p.inv.ge(0), flat, 0);
        g.dgates = assign(b.out.dgates, flat.view({d.T, d.k}).to(a.gates.scalar_type()));
      }
    }

    at::Tensor db_rows;  // s1 · du · B1_e [M, rp1]
    if (lora1 && need_up) {
      const at::Tensor b1p = pad_b(a.gate_up_lora.b, d.E, p.r1, p.rp1);
      db_rows = at::_grouped_mm(du, b1p.view({2 * d.I, d.E, p.rp1}).permute({1, 0, 2}), p.offs);
      db_rows = mask_rows(p, db_rows).mul_(a.gate_up_lora.scaling).contiguous();
    }
    if (b.need_dx) {
      at::Tensor dx_rows = at::empty({d.M, d.H}, p.x.options());
      at::Tensor a1p;
      if (lora1) a1p = pad_a(a.gate_up_lora.a, d.E, p.r1, p.rp1);  // [E·rp1, H]: MN-major B2
      // W1_eᵀ as [K = 2I, N = H]: EKN [E, H, 2I] is K-major, ENK [E, 2I, H] MN-major.
      store_gemm(p, du, p.w1, p.ekn, p.ekn ? 2 * d.I : d.H, d.H, db_rows, a1p, false, at::Tensor(), dx_rows, "backward dX GEMM");
      g.dx = assign(b.out.dx, combine(p, dx_rows, at::Tensor()).to(a.x.scalar_type()));
    }

    if (b.need_dlora && lora1) {
      // dB1_e = du_eᵀ · (s1·XA)_e [2I, rp1] per expert (K-grouped), dA1 = Z1ᵀ · X with Z1 = spread(DB).
      at::Tensor db1 = zero_empty(p, at::_grouped_mm(du.t(), xa_rows, p.offs));  // [E, 2I, rp1]
      db1 = db1.permute({1, 0, 2}).reshape({2 * d.I, d.E * p.rp1});
      const at::Tensor da1 = at::mm(spread_rows(p, db_rows, p.rp1).t(), p.x);  // [E·rp1, H]
      g.dgate_up_lora_a = assign(b.out.dgate_up_lora_a, unpad_a(da1, d.E, p.r1, p.rp1));
      g.dgate_up_lora_b = assign(b.out.dgate_up_lora_b, unpad_b(db1, d.E, p.r1, p.rp1));
    }
    if (need_da2) {
      // dB2 = Gᵀ · Z2 with Z2 = spread(g · s2·HA) [H, E·rp2]; dA2_e = (s2·g·GB)_eᵀ · h_e [rp2, I].
      const at::Tensor gha = (ha_rows * g_rows.unsqueeze(1)).contiguous();
      const at::Tensor db2 = at::mm(gy.t(), spread_rows(p, gha, p.rp2));
      const at::Tensor sgb = mask_rows(p, gb_rows * g_rows.unsqueeze(1)).mul_(a.down_lora.scaling).contiguous();
      at::Tensor da2 = zero_empty(p, at::_grouped_mm(sgb.t(), h, p.offs)).reshape({d.E * p.rp2, d.I});
      g.ddown_lora_a = assign(b.out.ddown_lora_a, unpad_a(da2, d.E, p.r2, p.rp2));
      g.ddown_lora_b = assign(b.out.ddown_lora_b, unpad_b(db2, d.E, p.r2, p.rp2));
    }
    return g;
  }

 private:
  // decline() said yes to the engine's chain; a direct caller gets the reason as an error instead.
  static void require_served(const MoeMlpArgs& a) {
#ifndef AXENGINE_SONICMOE_HOST_EMULATION
    if (!a.x.is_cuda()) throw UsageError("moe.mlp[sonicmoe]: x: needs a CUDA tensor");
#endif
    if (auto why = decline_reason(a)) throw UsageError(str("moe.mlp[sonicmoe]: cannot serve this call: ", *why));
    if (const char* why = gather_gemm_unavailable(a.x.device().index()))
      throw UsageError(str("moe.mlp[sonicmoe]: ", why));
  }
};

}  // namespace

std::shared_ptr<ops::MoeMlp> make_backend() { return std::make_shared<SonicMoe>(); }

}  // namespace ax::sonicmoe
