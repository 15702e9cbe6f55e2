// Shared pieces of the scattermoe ATen glue (scattermoe_plugin.cpp: the op and the fused path;
// split_path.cpp: the split path for few large experts).
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include <axengine/error.hpp>
#include <axengine/ops/moe_experts.hpp>
#include <axengine/strings.hpp>

#include "../kernels/moe_gemm.hpp"
#include "options.hpp"
#include "tuner.hpp"

namespace ax::scattermoe::glue {

// What one scattermoe backend object runs with: the path mode and tile selection its options set
// ([kernels.options.scattermoe]; defaults until the engine hands them over).
struct Context {
  PathMode path = PathMode::automatic;
  Tuner tuner;
  void configure(const Options& options) {
    path = path_mode(options.path);
    tuner.configure(options);
  }
};

inline DType kernel_dtype(at::ScalarType t) {
  if (t == at::kBFloat16) return DType::bf16;
  if (t == at::kHalf) return DType::fp16;
  throw UsageError(str("moe.experts[scattermoe]: dtype ", c10::toString(t), " is not supported (bf16, fp16)"));
}

// Row-major view with unit column stride (copies only when the caller's tensor is not).
inline at::Tensor rows(const at::Tensor& t) { return (t.dim() == 2 && t.stride(1) == 1) ? t : t.contiguous(); }

// An expert weight as the kernels read it. Dense: W_e(k, n) = w[e*estride + (kmajor ? n*ld + k : k*ld + n)].
// Packed: the stored matrix of each expert is the logical weight's [K, N] (EKN, kmajor false) or [N, K]
// (ENK, kmajor true), row-major, decoded by the kernels (kernels/moe_gemm.hpp, PackedWeight); `keep`
// holds the (contiguous) tensors the pointers in `packed` refer to.
struct WeightView {
  at::Tensor t;
  int64_t estride = 0, ld = 0;
  bool kmajor = false;
  PackedWeight packed;
  std::vector<at::Tensor> keep;
};
WeightView weight_view(const ops::MoeExpertsArgs& args);

struct Routing {
  at::Tensor expert, scattered, offsets;
  at::Tensor ws;  // [2(E+1)] int64: seg, then tile_start (2(E+1) int32: 128-row and 64-row tiles)
  int64_t* seg() const { return ws.data_ptr<int64_t>(); }
  int32_t* tiles() const { return reinterpret_cast<int32_t*>(ws.data_ptr<int64_t>() + offsets.size(0) + 1); }
};

inline Routing prepare(const ops::MoeExpertsArgs& args, cudaStream_t stream) {
  Routing r;
  r.expert = args.routing.sorted_expert_idxs.contiguous();
  r.scattered = args.routing.sorted_scattered_idxs.contiguous();
  r.offsets = args.routing.expert_offsets.contiguous();
  const int64_t E = r.offsets.size(0);
  r.ws = at::empty({2 * (E + 1)}, r.offsets.options());
  launch_prep(r.offsets.data_ptr<int64_t>(), static_cast<int>(E), 0, r.seg(), r.tiles(), stream);
  check_launch("routing preparation");
  return r;
}

// inv[s] = sorted row of scattered entry s (s = t·k + j), -1 for inactive entries: [M] int64, on the
// device (launch_inverse_rows). The combine, the dX k-sum and dgates read sorted rows through it.
at::Tensor inverse_rows(const Routing& rt, int64_t M, cudaStream_t stream);
// The sorted rows in scattered order (row s = rows[inv[s]], zero where inv[s] < 0): the ATen form of what
// the gates kernels read through inv, for shapes they do not vectorise.
at::Tensor scattered_rows(const at::Tensor& rows, const at::Tensor& inv);

// A grouped launch of one projection with its routing filled in (expert segments, tile starts, the
// expert of each sorted row); the caller sets the operands.
GroupedGemmArgs routed(DType dtype, const ops::MoeDims& d, const Routing& rt);

// A thin product (N = r: XA, YB) through the tuner, split along K when it has few row tiles for the GPU
// (thin_split_k; the fp32 workspace is allocated here).
void run_thin(Tuner& tuner, GroupedGemmArgs t, int64_t rank, const at::Tensor& like, cudaStream_t stream, const char* what);

// XA = s · A · A_eᵀ, [M, r], by the thin kernel, where A is the first operand `g` already names (rows,
// gather): A_e(k, j) = lora_a[(e r + j), k]. Saved for backward by both paths.
at::Tensor lora_xa(Tuner& tuner, const GroupedGemmArgs& g, const ops::MoeExpertsArgs& args, const ops::MoeDims& d,
                   const at::Tensor& opts_like, cudaStream_t stream, const char* what);

// Fused path: one kernel per product, LoRA fused into the base GEMM. Split path (few large experts):
// base GEMM by at::_grouped_mm (CUTLASS, sm_90/sm_100, bf16), LoRA and scatter by our kernels.
enum class Path { fused, split };
// Option path = fused | split | split_gmm overrides the shape rule (split where it cannot run: fused,
// with one warning).
Path choose_path(PathMode mode, const ops::MoeExpertsArgs& args, const ops::MoeDims& d);

// Split forward of one projection: the expert outputs (bias and LoRA included) and XA (undefined without
// LoRA), the same tensors the fused path produces. The outputs go to `target` (grouped rows, or scattered
// rows into a zeroed target when scattered_out) or, with `target` undefined (grouped rows the caller did
// not preallocate), in place into the base product's buffer (saves an [M, N] buffer). Either way rows
// past the last expert are not written.
struct SplitForward {
  at::Tensor y_rows, xa;
};
SplitForward split_forward(Context& ctx, const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                           const at::Tensor& x, const at::Tensor& target, bool scattered_out, cudaStream_t stream);

// Split backward pieces: dys = g · dY in sorted row order ([M, N]); then the dX rows = dys · W_eᵀ + YB · A_e
// ([M, K] in sorted order, in place in the base product's buffer; rows past the last expert not written).
at::Tensor split_sorted_grad(const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                             const at::Tensor& gy, const at::Tensor& gates_flat, cudaStream_t stream);
// YB (= s · dys · B_e, [M, r]) and dB ([N, r·E]) in one pass over dys (kernels/lora_grad.cu), from the
// forward's XA. False, computing nothing, where that kernel does not apply (rank not a multiple of 8 or
// above 32, unaligned rows): the caller then uses the thin and Gram kernels.
bool split_lora_grads(const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt, const at::Tensor& dys,
                      const at::Tensor& xa, const at::Tensor& yb, const at::Tensor& db, cudaStream_t stream);
at::Tensor split_dx(Context& ctx, const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                    const at::Tensor& dys, const at::Tensor& yb, const at::Tensor& la, cudaStream_t stream);

}  // namespace ax::scattermoe::glue
