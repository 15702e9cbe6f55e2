// Registers the `aten` kernel providers of core's ops, with the requirements selection checks them by.
// linear.lora and attention claim bf16/fp16 only: fp32 stays with `reference` (a bf16/fp16 GEMM path gains
// nothing there, and fp32 calls are the parity tests against HF goldens). norm_rope claims fp32 too: its
// math is the reference's, with fp32 statistics, in fewer kernels. linear_attention (the chunked form) and
// causal_conv1d (gathers instead of a loop over sequences) claim fp32 too: they are what makes those ops
// graph-safe and fast enough to train with.
//
// Not here, on purpose:
//  - dequant: core's dequantize() already writes the requested dtype from its fp32 table math; an aten
//    copy of the reference would add nothing.
//  - a cuDNN attention ("aten_cudnn"): LibTorch 2.11 has at::_cudnn_attention_forward with cum_seq_q/k,
//    but it has no sliding window, and torch 2.11's own varlen_attn switches that path off
//    (torch/nn/attention/varlen.py: _should_use_cudnn returns False).
#include "ops/aten/register.hpp"

#include <memory>

#include "axengine/ops/attention.hpp"
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/norm_rope.hpp"

namespace ax::ops {

std::shared_ptr<LinearLora> make_aten_linear_lora();  // ops/aten/linear_lora.cpp
std::shared_ptr<Attention> make_aten_attention();     // ops/aten/attention.cpp
std::shared_ptr<NormRope> make_aten_norm_rope();      // ops/aten/norm_rope.cpp
std::shared_ptr<LinearAttention> make_aten_linear_attention();  // ops/aten/linear_attention.cpp
std::shared_ptr<CausalConv1d> make_aten_causal_conv1d();        // ops/aten/causal_conv1d.cpp

void register_aten_kernels(Registry& registry) {
  {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = LinearLora::kOp;
    p.info.name = "aten";
    p.info.graph_safe = true;  // no host sync, nothing read at capture time (conformance cuda_graph check)
    p.info.needs.devices = {"cpu", "cuda"};
    p.info.needs.dtypes = {"bf16", "fp16"};
    p.info.needs.formats = {"dense", "nf4", "mxfp4", "nvfp4", "fp8"};
    p.info.summary =
        "production: ATen GEMMs in the compute dtype (cuBLAS, fp32 accumulation), LoRA added by an in-place "
        "addmm; a packed W is dequantised to the compute dtype per call, never kept";
    p.object = make_aten_linear_lora();
    registry.add(std::move(p));
  }
  {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = Attention::kOp;
    p.info.name = "aten";
    p.info.graph_safe = true;  // no host sync, nothing read at capture time (conformance cuda_graph check)
    p.info.needs.devices = {"cuda"};
    p.info.needs.arch_min = 80;  // FlashAttention-2 needs Ampere or newer
    p.info.needs.dtypes = {"bf16", "fp16"};
    p.info.needs.layouts = {"plain", "sinks"};  // sinks wrap flash (ops/aten/attention.cpp)
    p.info.summary =
        "production: LibTorch's varlen FlashAttention-2 (native GQA, sliding window, sinks, deterministic backward); "
        "head_dim > 256, not a multiple of 8, or Dv != D use the reference math";
    p.object = make_aten_attention();
    registry.add(std::move(p));
  }
  {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = NormRope::kOp;
    p.info.name = "aten";
    p.info.graph_safe = true;  // no host sync, nothing read at capture time (conformance cuda_graph check)
    p.info.needs.devices = {"cpu", "cuda"};
    p.info.needs.dtypes = {"fp32", "bf16", "fp16"};
    p.info.summary =
        "production: at::rms_norm (fused on CUDA) and the rotation written straight into y; fp32 statistics, "
        "no fp32 copy of x on CUDA";
    p.object = make_aten_norm_rope();
    registry.add(std::move(p));
  }
  {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = LinearAttention::kOp;
    p.info.name = "aten";
    p.info.graph_safe = true;  // index maps built on the device, a fixed number of scan steps: no host sync
    p.info.needs.devices = {"cpu", "cuda"};
    p.info.needs.dtypes = {"fp32", "bf16", "fp16"};
    p.info.summary =
        "production: the chunked (WY/UT) gated delta rule, chunk 64, matmul operands in the compute dtype with fp32 "
        "accumulation, fp32 state; hand-derived chunked backward";
    p.object = make_aten_linear_attention();
    registry.add(std::move(p));
  }
  {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = CausalConv1d::kOp;
    p.info.name = "aten";
    p.info.graph_safe = true;  // index maps built on the device: no host sync
    p.info.needs.devices = {"cpu", "cuda"};
    p.info.needs.dtypes = {"fp32", "bf16", "fp16"};
    p.info.summary = "production: W gathers over the packed rows, fp32 sum and SiLU, rounded once; no loop over sequences";
    p.object = make_aten_causal_conv1d();
    registry.add(std::move(p));
  }
}

}  // namespace ax::ops
