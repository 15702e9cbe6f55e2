// nf4::quantize (nf4.hpp): ops::quantize_nf4 on the GPU in two kernels (kernels/quantize.cu). What is not
// a kernel uses the reference's own ATen calls, so that it rounds the same way on the same device: the
// mean of the absmax (double quant's offset), the dynamic map and its midpoints.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>

#include <axengine/ops/quant.hpp>
#include <axengine/strings.hpp>

#include "glue.hpp"
#include "nf4.hpp"

namespace ax::nf4 {

ops::WeightTensor quantize(const at::Tensor& w, int64_t blocksize, bool double_quant) {
  constexpr const char* fn = "quantize";
  require_cuda(w, fn, "w");
  if (w.numel() == 0) fail(fn, "w", "is empty");
  if (blocksize < 16 || blocksize > 4096 || (blocksize & (blocksize - 1)) != 0)
    fail(fn, "blocksize", str("must be a power of two in 16..4096, got ", blocksize));
  if (w.numel() % blocksize != 0)
    fail(fn, "w", str(w.numel(), " elements are not a multiple of blocksize ", blocksize));
  // fp64 is read as fp32 by the reference (w.to(kFloat)); the kernel reads fp32/bf16/fp16 directly.
  at::Tensor x = (w.scalar_type() == at::kDouble ? w.to(at::kFloat) : w).contiguous();
  const DType dt = kernel_dtype(x.scalar_type(), fn, "w");
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) x = x.clone();  // 16-byte loads need alignment
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = stream_of(x);

  const int64_t n = x.numel(), nb = n / blocksize;
  const auto opts = x.options();
  at::Tensor codes = at::empty({n / 2}, opts.dtype(at::kByte));
  at::Tensor absmax = at::empty({nb}, opts.dtype(at::kFloat));
  QuantizeNf4Launch q;
  q.x = x.data_ptr();
  q.dtype = dt;
  q.n = n;
  int lg = 0;
  while ((int64_t{1} << lg) < blocksize) ++lg;
  q.log2_blocksize = lg;
  // core's blockwise_nearest: bounds = (code[:-1] + code[1:]) / 2 in fp32 (exact halving).
  const std::array<float, 16>& t = ops::nf4_values();
  for (int i = 0; i < 15; ++i) q.bounds[i] = (t[i] + t[i + 1]) / 2.0f;
  q.codes = codes.data_ptr<uint8_t>();
  q.absmax = absmax.data_ptr<float>();
  launch_quantize_nf4(q, stream);
  check_launch("nf4 quantize kernel launch");

  ops::WeightTensor out;
  out.format = ops::WeightFormat::nf4;
  out.shape = w.sizes().vec();
  out.blocksize = blocksize;
  out.codes = codes;
  if (!double_quant) {
    out.scales = absmax;
    return out;
  }
  // bitsandbytes compress_statistics, as ops::quantize_nf4: offset = mean(absmax) (ATen's reduction, so
  // the same fp32 sum), then the absmax - offset in blocks of 256 (a shorter last one) on the dynamic map.
  const at::Tensor offset = absmax.mean();
  const at::Tensor code = ops::bnb_dynamic_map().to(x.device());
  const at::Tensor bounds = ((code.slice(0, 0, 255) + code.slice(0, 1, 256)) / 2).contiguous();
  at::Tensor qabsmax = at::empty({nb}, opts.dtype(at::kByte));
  at::Tensor nested = at::empty({(nb + 255) / 256}, opts.dtype(at::kFloat));
  QuantizeAbsmaxLaunch s;
  s.absmax = absmax.data_ptr<float>();
  s.offset = offset.data_ptr<float>();
  s.bounds = bounds.data_ptr<float>();
  s.n = nb;
  s.codes = qabsmax.data_ptr<uint8_t>();
  s.nested_absmax = nested.data_ptr<float>();
  launch_quantize_absmax(s, stream);
  check_launch("nf4 absmax quantize kernel launch");
  out.scales = qabsmax;
  out.nested_scales = nested;
  out.nested_code = code;
  out.nested_offset = offset.item<float>();
  out.nested_blocksize = 256;
  return out;
}

}  // namespace ax::nf4
