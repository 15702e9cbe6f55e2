// nf4::dequantize_range / dequantize_experts (nf4.hpp): argument checks, then one launch of
// kernels/dequant.cu.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <axengine/strings.hpp>

#include "glue.hpp"
#include "nf4.hpp"

namespace ax::nf4 {
namespace {

// The weight's fields as the kernel reads them: flat, contiguous (bnb stores codes as [n/2, 1]; a copy
// only for a caller's strided view). Holds the tensors while the launch is queued.
struct Fields {
  at::Tensor codes, scales, nested_scales, nested_code;
};

DequantLaunch launch_args(const ops::WeightTensor& w, const at::Tensor& out, const char* fn, Fields& f) {
  if (w.format != ops::WeightFormat::nf4) fail(fn, "w", str("must be an nf4 weight, got ", w.describe()));
  ops::validate_weight(w, str("nf4 ", fn, ": w"));
  require_cuda(w.codes, fn, "w.codes");
  require_cuda(out, fn, "out");
  if (out.device() != w.codes.device())
    fail(fn, "out", str("is on ", out.device().str(), " but the weight is on ", w.codes.device().str()));
  if (!out.is_contiguous()) fail(fn, "out", "must be contiguous");

  DequantLaunch p;
  p.dtype = kernel_dtype(out.scalar_type(), fn, "out");
  f.codes = w.codes.contiguous();
  f.scales = w.scales.contiguous();
  p.codes = f.codes.data_ptr<uint8_t>();
  if (w.double_quant()) {
    f.nested_scales = w.nested_scales.contiguous();
    f.nested_code = w.nested_code.contiguous();
    p.qabsmax = f.scales.data_ptr<uint8_t>();
    p.nested_scales = f.nested_scales.data_ptr<float>();
    p.nested_code = f.nested_code.data_ptr<float>();
    // ops::dequantize adds the double to an fp32 tensor: ATen rounds the scalar to fp32 first.
    p.nested_offset = static_cast<float>(w.nested_offset);
    p.nested_blocksize = w.nested_blocksize;
  } else {
    p.absmax = f.scales.data_ptr<float>();
  }
  int lg = 0;
  while ((int64_t{1} << lg) < w.blocksize) ++lg;
  p.log2_blocksize = lg;
  p.out = out.data_ptr();
  return p;
}

}  // namespace

void dequantize_range(const ops::WeightTensor& w, int64_t start, const at::Tensor& out) {
  constexpr const char* fn = "dequantize_range";
  Fields f;
  DequantLaunch p = launch_args(w, out, fn, f);
  const int64_t n = w.numel(), count = out.numel();
  if (start < 0 || start > n || count > n - start)
    fail(fn, "start", str("the range [", start, ", ", start + count, ") is outside the weight's ", n, " elements"));
  p.start = start;
  p.count = count;
  const c10::cuda::CUDAGuard guard(out.device());
  launch_dequant(p, stream_of(out));
  check_launch("dequant kernel launch");
}

void dequantize_experts(const ops::WeightTensor& w, const at::Tensor& experts, const at::Tensor& out) {
  constexpr const char* fn = "dequantize_experts";
  Fields f;
  DequantLaunch p = launch_args(w, out, fn, f);
  if (w.dim() < 2) fail(fn, "w", str("the selective form needs a weight of >= 2 dims, got ", w.describe()));
  require_cuda(experts, fn, "experts");
  if (experts.scalar_type() != at::kLong || experts.dim() != 1) fail(fn, "experts", "must be a 1-dim int64 tensor");
  if (experts.device() != out.device()) fail(fn, "experts", "must be on the weight's device");
  const int64_t per = w.numel() / w.shape[0];
  if (per % w.blocksize != 0)
    fail(fn, "experts", str("each expert's ", per, " elements must be a multiple of blocksize ", w.blocksize));
  if (out.numel() != experts.numel() * per)
    fail(fn, "out", str("has ", out.numel(), " elements, not ", experts.numel(), " experts of ", per));
  const at::Tensor ids = experts.contiguous();
  p.experts = ids.data_ptr<int64_t>();
  p.slices = ids.numel();
  p.count = per;
  const c10::cuda::CUDAGuard guard(out.device());
  launch_dequant(p, stream_of(out));
  check_launch("dequant kernel launch (selective)");
}

void dequantize_columns(const ops::WeightTensor& w, int64_t k0, const at::Tensor& out) {
  constexpr const char* fn = "dequantize_columns";
  Fields f;
  DequantLaunch p = launch_args(w, out, fn, f);
  if (w.dim() != 2) fail(fn, "w", str("must be 2-dim [N, K], got ", w.describe()));
  const int64_t N = w.shape[0], K = w.shape[1];
  if (out.dim() != 2 || out.size(0) != N) fail(fn, "out", str("must be [", N, ", kc]"));
  const int64_t kc = out.size(1);
  if (k0 < 0 || k0 > K || kc > K - k0)
    fail(fn, "k0", str("the columns [", k0, ", ", k0 + kc, ") are outside the weight's ", K));
  p.start = k0;
  p.count = kc;
  p.slices = N;
  p.src_stride = K;
  const c10::cuda::CUDAGuard guard(out.device());
  launch_dequant(p, stream_of(out));
  check_launch("dequant kernel launch (columns)");
}

}  // namespace ax::nf4
