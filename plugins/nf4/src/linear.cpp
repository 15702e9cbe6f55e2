// The QLoRA linear (nf4.hpp, linear.hpp): core's aten linear.lora (core/src/ops/aten/linear_lora.cpp)
// with the same GEMMs in the same order, except that the nf4 weight is never dequantised whole — a chunk
// of it at a time is decoded into one reused buffer and multiplied:
//   forward:  y[:, n0:n1] = x·W[n0:n1, :]ᵀ (+ bias[n0:n1])   chunks of rows: each output element is still
//             one dot product over the whole K, as in the reference
//             y += s·(x·Aᵀ)·Bᵀ
//   backward: u = G·B
//             dx[:, k0:k1] = G·W[:, k0:k1]                 chunks of columns: each dx element is one
//             dx += s·u·A                                  dot product over the whole N (one rounding, as
//             dA = s·uᵀ·x,  dB = s·Gᵀ·(x·Aᵀ)                the reference; row chunks accumulated with
//                                                          beta = 1 would round once per chunk)
// Extra memory: one chunk (kChunkElems elements), never [N, K]. The GEMMs are ATen's (cuBLAS), which write
// a column block of y / dx in place through its leading dimension.
#include "linear.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "glue.hpp"

namespace ax::nf4 {
namespace {

// As the aten backend: the caller's output when a plain view of it can be written, else a fresh buffer
// that finish() copies over.
at::Tensor target(const at::Tensor& out, at::IntArrayRef shape2d, const at::TensorOptions& opts) {
  if (out.defined() && out.is_contiguous()) return out.view(shape2d);
  return at::empty(shape2d, opts);
}
at::Tensor finish(const at::Tensor& result2d, const at::Tensor& out, at::IntArrayRef shape) {
  if (!out.defined()) return result2d.view(shape);
  if (!result2d.is_alias_of(out)) out.copy_(result2d.view(shape));
  return out;
}
void gemm_scaled(at::Tensor& dst, const at::Tensor& m1, const at::Tensor& m2, double alpha) {
  at::addmm_out(dst, dst, m1, m2, /*beta=*/0, /*alpha=*/alpha);
}

void check_args(const ops::LinearLoraArgs& a, const char* fn) {
  if (a.weight.format != ops::WeightFormat::nf4)
    fail(fn, "weight", str("must be an nf4 weight, got ", a.weight.describe()));
  if (a.weight.dim() != 2) fail(fn, "weight", str("must be 2-dim [N, K], got ", a.weight.describe()));
  require_cuda(a.x, fn, "x");
  if (a.x.scalar_type() != at::kBFloat16 && a.x.scalar_type() != at::kHalf)
    fail(fn, "x", str("must be bf16 or fp16, got ", c10::toString(a.x.scalar_type())));
}

}  // namespace

int64_t chunk_extent(int64_t dim, int64_t other, int64_t chunk_elems) {
  int64_t e = chunk_elems / std::max<int64_t>(other, 1);
  e = std::max<int64_t>(128, e / 128 * 128);
  return std::min(e, dim);
}

at::Tensor linear_forward_chunked(const ops::LinearLoraArgs& a, int64_t chunk_elems) {
  check_args(a, "linear_forward");
  const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
  const at::Tensor x = a.x.reshape({-1, K});
  const int64_t M = x.size(0);
  auto shape = a.x.sizes().vec();
  shape.back() = N;
  at::Tensor y = target(a.out, {M, N}, a.x.options());
  if (M > 0) {
    const int64_t rows = chunk_extent(N, K, chunk_elems);
    const at::Tensor buf = at::empty({rows, K}, a.x.options());
    for (int64_t n0 = 0; n0 < N; n0 += rows) {
      const int64_t n = std::min(rows, N - n0);
      const at::Tensor wc = buf.narrow(0, 0, n);  // the leading rows of the buffer: contiguous
      dequantize_range(a.weight, n0 * K, wc);
      at::Tensor yc = y.narrow(1, n0, n);
      if (a.bias.defined()) at::addmm_out(yc, a.bias.narrow(0, n0, n), x, wc.t());
      else at::mm_out(yc, x, wc.t());
    }
  }
  if (a.lora_a.defined()) {
    const at::Tensor t = at::mm(x, a.lora_a.t());               // [M, r]
    y.addmm_(t, a.lora_b.t(), /*beta=*/1, /*alpha=*/a.scaling);  // accumulates into y
  }
  return finish(y, a.out, shape);
}

ops::LinearLoraGrads linear_backward_chunked(const ops::LinearLoraArgs& a, const ops::LinearLoraBackwardArgs& b,
                                             int64_t chunk_elems) {
  check_args(a, "linear_backward");
  const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
  const at::Tensor g = b.grad_y.reshape({-1, N});
  const int64_t M = g.size(0);
  const bool lora = a.lora_a.defined();
  const auto opts = a.x.options();
  const at::Tensor u = lora && (b.need_dx || b.need_dlora) ? at::mm(g, a.lora_b) : at::Tensor();  // [M, r]
  ops::LinearLoraGrads out;
  if (b.need_dx) {
    at::Tensor dx = target(b.out.dx, {M, K}, opts);
    if (M > 0) {
      const int64_t cols = chunk_extent(K, N, chunk_elems);
      const at::Tensor buf = at::empty({N * cols}, opts);
      for (int64_t k0 = 0; k0 < K; k0 += cols) {
        const int64_t kc = std::min(cols, K - k0);
        const at::Tensor wc = buf.narrow(0, 0, N * kc).view({N, kc});
        dequantize_columns(a.weight, k0, wc);
        at::Tensor dxc = dx.narrow(1, k0, kc);
        at::mm_out(dxc, g, wc);
      }
    }
    if (lora) dx.addmm_(u, a.lora_a, /*beta=*/1, /*alpha=*/a.scaling);
    out.dx = finish(dx, b.out.dx, a.x.sizes());
  }
  if (lora && b.need_dlora) {
    const at::Tensor x = a.x.reshape({-1, K});
    const int64_t r = a.lora_a.size(0);
    at::Tensor da = target(b.out.dlora_a, {r, K}, opts);
    gemm_scaled(da, u.t(), x, a.scaling);
    out.dlora_a = finish(da, b.out.dlora_a, a.lora_a.sizes());
    const at::Tensor t = at::mm(x, a.lora_a.t());  // [M, r], recomputed rather than kept from forward
    at::Tensor db = target(b.out.dlora_b, {N, r}, opts);
    gemm_scaled(db, g.t(), t, a.scaling);
    out.dlora_b = finish(db, b.out.dlora_b, a.lora_b.sizes());
  }
  return out;
}

at::Tensor linear_forward(const ops::LinearLoraArgs& args) { return linear_forward_chunked(args, kChunkElems); }

ops::LinearLoraGrads linear_backward(const ops::LinearLoraArgs& args, const ops::LinearLoraBackwardArgs& bwd) {
  return linear_backward_chunked(args, bwd, kChunkElems);
}

}  // namespace ax::nf4
