// The fp8 plugin's dequant backend (ops::Dequant, docs/ops/dequant.md): fine-grained FP8 weights -> fp32 / bf16 /
// fp16, whole or selected experts, into a fresh tensor or the caller's `out`, by one launch of
// kernels/fp8_dequant.cu. Bit-exact with ops::dequantize. No host synchronisation (the selective ids are read on
// the device), so it captures into CUDA graphs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <axengine/error.hpp>
#include <axengine/ops/dequant.hpp>
#include <axengine/strings.hpp>

#include "../kernels/fp8_dequant.hpp"
#include "fp8_plugin.hpp"

namespace ax::fp8 {
namespace {

DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::fp32;
    case at::kBFloat16: return DType::bf16;
    case at::kHalf: return DType::fp16;
    default: throw UsageError(str("dequant[fp8]: dtype: must be fp32, bf16 or fp16, got ", c10::toString(t)));
  }
}

class Fp8Dequant final : public ops::Dequant {
 protected:
  at::Tensor run(const ops::DequantArgs& a) override {
    const ops::WeightTensor& w = a.weight;
    if (w.format != ops::WeightFormat::fp8)
      throw UsageError(str("dequant[fp8]: weight: only fp8 weights are served, got ", w.describe()));
    if (!w.codes.is_cuda()) throw UsageError(str("dequant[fp8]: weight: needs CUDA tensors, got ", w.codes.device().str()));
    auto shape = w.shape;
    if (a.experts.defined()) shape[0] = a.experts.numel();
    // fp64 (accepted by the op for gradient checks) decodes in fp32 and widens: what the reference does.
    const at::ScalarType decode = a.dtype == at::kDouble ? at::kFloat : a.dtype;
    const bool direct = a.out.defined() && a.out.is_contiguous() && a.out.scalar_type() == decode;
    at::Tensor y = direct ? a.out : at::empty(shape, w.codes.options().dtype(decode));
    const at::Tensor codes = w.codes.contiguous(), scales = w.scales.contiguous();
    const at::Tensor ids = a.experts.defined() ? a.experts.contiguous() : at::Tensor();
    Fp8DequantLaunch p;
    p.codes = static_cast<const uint8_t*>(codes.data_ptr());
    p.scales = scales.data_ptr<float>();
    p.out = y.data_ptr();
    p.dtype = kernel_dtype(decode);
    p.rows = w.shape[w.shape.size() - 2];
    p.cols = w.shape.back();
    p.block_rows = w.block_rows;
    p.block_cols = w.blocksize;
    p.slices = p.rows * p.cols == 0 ? 0 : y.numel() / (p.rows * p.cols);
    p.experts = ids.defined() ? ids.data_ptr<int64_t>() : nullptr;
    if (y.numel() > 0) {
      const c10::cuda::CUDAGuard guard(y.device());
      launch_fp8_dequant(p, c10::cuda::getCurrentCUDAStream(y.device().index()).stream());
      if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
        throw RuntimeError(str("fp8: dequant kernel launch failed: ", cudaGetErrorString(err)));
    }
    if (a.out.defined() && !direct) {
      a.out.copy_(y);
      return a.out;
    }
    return decode == a.dtype ? y : y.to(a.dtype);
  }
};

}  // namespace

std::shared_ptr<ops::Dequant> make_dequant() { return std::make_shared<Fp8Dequant>(); }

}  // namespace ax::fp8
