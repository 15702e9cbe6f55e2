// The launchers of the fused_attn kernels and their arguments: plain structs of pointers and element
// strides, shared by the .cu kernels and the ATen glue (../src). Every launcher checks nothing about
// shapes — the glue does (../src/plan.hpp decides the path, ../src/views.hpp the strides) — and returns
// after queueing on `stream`; the glue calls check_launch after each.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ax::fused_attn {

enum class DType { fp32, bf16, fp16 };

// Element (t, h, i) of a [tokens, heads, cols] operand at p + t·st + h·sh + i·si (elements).
struct View3 {
  void* p = nullptr;
  int64_t st = 0, sh = 0, si = 1;
};
// Element (r, i) of a [rows, cols] operand at p + r·ld + i·si.
struct View2 {
  void* p = nullptr;
  int64_t ld = 0, si = 1;
};
// Element i of a vector at p + i·s.
struct View1 {
  void* p = nullptr;
  int64_t s = 1;
};

// norm_rope over x [tokens, heads, D] (docs/ops/norm_rope.md). Rotation from cos/sin [tokens, R] (any
// compute dtype, cs_dtype) or, with pos defined, angle = pos[t] · inv_freq[i mod R/2] (fp32), times scaling.
struct NormRopeArgs {
  DType dtype = DType::bf16;
  int64_t tokens = 0;
  int heads = 0, D = 0, R = 0;
  bool vec = false;  // 16-byte path (plan::vectorisable over x, y / grad, dx)
  View3 x;
  View1 w;
  bool weight_offset = false;
  float eps = 1e-6f;
  DType cs_dtype = DType::fp32;
  View2 cos, sin;
  View1 pos, inv_freq;  // int64, fp32
  float scaling = 1.f;
  View3 y;  // forward output
  // backward
  View3 gy, dx;              // dx.p null: no dx
  float* partial = nullptr;  // [blocks, D] fp32 dweight partials, or null
  int blocks = 0;            // backward grid (plan::reduction_blocks when partial is set)
};
void launch_norm_rope_forward(const NormRopeArgs& a, cudaStream_t stream);
void launch_norm_rope_backward(const NormRopeArgs& a, cudaStream_t stream);

// out[c] = Σ_b partial[b·cols + c] in ascending b (fp32), rounded to `dtype`.
void launch_reduce_partials(const float* partial, int blocks, int64_t cols, DType dtype, View1 out,
                            cudaStream_t stream);

// rms_norm over rows of H (ops/rms_norm.hpp). Forward: s = round(x + residual) (residual.p null: s = x),
// sum written when sum.p is set, rstd[r] fp32, y = round(w' · round(s · rstd)).
struct RmsNormArgs {
  DType dtype = DType::bf16;
  int64_t rows = 0, H = 0;
  bool vec = false;
  int threads = 0, chunks = 0;  // plan::rms_norm_shape
  View2 x, residual, sum, y;
  View1 w;
  bool weight_offset = false;
  float eps = 1e-6f;
  float* rstd = nullptr;  // [rows], contiguous
  // backward: s (= sum), gy, grad_sum (p null: none), dx; rstd read
  View2 gy, grad_sum, dx;
  float* partial = nullptr;  // [blocks, H] dweight partials, or null
  int blocks = 0;
};
void launch_rms_norm_forward(const RmsNormArgs& a, cudaStream_t stream);
void launch_rms_norm_backward(const RmsNormArgs& a, cudaStream_t stream);

// swiglu over [rows, I]: y = silu(gate) · up; backward dgate, dup (fp32 math, each rounded once).
struct SwigluArgs {
  DType dtype = DType::bf16;
  int64_t rows = 0, I = 0;
  bool vec = false;
  View2 gate, up, y;
  View2 gy, dgate, dup;
};
void launch_swiglu_forward(const SwigluArgs& a, cudaStream_t stream);
void launch_swiglu_backward(const SwigluArgs& a, cudaStream_t stream);

// linear_ce on one chunk of rows [rows, V] of logits (row r is token t0 + r).
struct CeArgs {
  DType dtype = DType::bf16;
  int64_t rows = 0, V = 0, t0 = 0;
  bool vec = false;
  View2 logits;   // forward: read (and with unit_grad overwritten); backward: overwritten with the gradient
  View1 targets;  // int64 [T]
  int64_t ignore_index = -100;
  float* lse = nullptr;     // forward: written [T] contiguous
  float* loss = nullptr;    // forward: written [T] contiguous
  bool unit_grad = false;   // forward: then overwrite the logits with softmax − onehot (grad_loss = 1)
  View1 lse_in, grad_loss;  // backward: fp32 [T]
};
void launch_ce_forward(const CeArgs& a, cudaStream_t stream);
void launch_ce_backward(const CeArgs& a, cudaStream_t stream);

// linear_ce's backward from the forward's unit gradient: dh[t] = round(grad_loss[t] · unit[t]) (fp32
// multiply), rows at ignore_index exactly 0.
struct CeScaleArgs {
  DType dtype = DType::bf16;
  int64_t rows = 0, H = 0;
  bool vec = false;
  View2 unit, dh;  // [rows, H]
  View1 targets;   // int64 [rows]
  int64_t ignore_index = -100;
  View1 grad_loss;  // fp32 [rows]
};
void launch_ce_scale(const CeScaleArgs& a, cudaStream_t stream);

}  // namespace ax::fused_attn
