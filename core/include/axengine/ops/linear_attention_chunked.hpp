// The chunked (WY / UT-transform) gated delta rule that chunked linear_attention backends share: everything
// chunk-parallel as batched ATen GEMMs (cuBLAS on the GPU) and elementwise ops, with the two sequential parts,
// the scans over each sequence's chunks, left to the backend. Core's `aten` backend scans with a loop of ATen
// ops; a kernel plugin (gdn) scans with one kernel per direction. docs/ops/linear_attention.md, "Backends",
// holds the derivation.
//
// Per chunk slot c of C rows and value head h (q scaled and normalised, heads repeated), G = cumsum(g) inside
// the chunk, Γ_ij = exp(G_i − G_j) for j <= i, γ = exp(G_last):
//   T = (I + strict_lower(diag(β) K Kᵀ ∘ Γ))⁻¹,  U = T diag(β) V,  W = T diag(β e^G) K,  K_d = diag(e^{G_last − G}) K
// The forward scan, S the state entering the chunk (a sequence's first chunk starts from its initial state):
//   V' = U − W S,   S ← γ S + K_dᵀ V'
// The backward scan, dS the gradient of the state leaving the chunk (a sequence's last chunk starts from
// grad_final_state), with the chunk-local terms dV'_loc = Pᵀ dO and dS_loc = Q_gᵀ dO precomputed:
//   dV' = dV'_loc + K_d dS,   dS_in = dS_loc + γ dS − Wᵀ dV'
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_attention_chunks.hpp"

namespace ax::ops {

// What a scan reads and writes. Every tensor is contiguous, in the wide dtype (fp32; fp64 for fp64 inputs),
// laid out [NC, H, C, D] (chunk slot, value head, row, column) or [NC, H, Dk, Dv] for states.
struct GdrScanForward {
  const ChunkLayout* layout = nullptr;
  at::ScalarType dtype = at::kFloat;  // the compute dtype (q's): a scan may round its matmul operands to it
  at::Tensor U, W, Kd;  // [NC, H, C, Dv], [NC, H, C, Dk], [NC, H, C, Dk]
  at::Tensor gamma;     // [NC, H]
  at::Tensor S0;        // [N + 1, H, Dk, Dv]: each sequence's initial state, then zeros
  // Written by the scan, allocated zero by the caller. Slots no sequence owns may be left as they are.
  at::Tensor S_in;      // [NC, H, Dk, Dv]
  at::Tensor Vn;        // [NC, H, C, Dv]
};

struct GdrScanBackward {
  const ChunkLayout* layout = nullptr;
  at::ScalarType dtype = at::kFloat;
  at::Tensor W, Kd, gamma;       // as in GdrScanForward
  at::Tensor dVn_local;          // [NC, H, C, Dv]   Pᵀ dO
  at::Tensor dS_local;           // [NC, H, Dk, Dv]  Q_gᵀ dO
  at::Tensor GF;                 // [N + 1, H, Dk, Dv]: each sequence's grad_final_state, then zeros
  // Written by the scan, allocated zero by the caller.
  at::Tensor dS_out, dS_in;      // [NC, H, Dk, Dv]: the gradient of the state leaving / entering each chunk
  at::Tensor dVn;                // [NC, H, C, Dv]
};

// A linear_attention backend made of the shared chunked math and its own two scans. Deterministic and
// graph-safe when the scans are (the shared part is: gathers, fixed-order GEMMs and reductions, no host read).
class ChunkedLinearAttention : public LinearAttention {
 protected:
  virtual void scan_forward(GdrScanForward& s) = 0;
  virtual void scan_backward(GdrScanBackward& s) = 0;

  LinearAttentionResult run_forward(const LinearAttentionArgs& args) final;
  LinearAttentionGrads run_backward(const LinearAttentionArgs& args, const LinearAttentionBackwardArgs& bwd) final;
};

// a·b with both operands rounded to the compute dtype `dtype` and the product accumulated and returned in the
// wide dtype (bf16/fp16 GEMMs with an fp32 result on CUDA; on the CPU the rounded operands multiplied in fp32),
// as flash-linear-attention's kernels compute.
at::Tensor gdr_mm(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype);

}  // namespace ax::ops
