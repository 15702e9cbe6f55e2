// A backend of every core op that only a CUDA device admits (forwarding to the reference there): on a CPU,
// a [kernels] list naming only `cuda_only` leaves its op without a backend, which `validate` and `run` must
// refuse under kernels.strict for every op a model calls (tests/unit/validate_start_cli_test.cpp,
// model_op_plan_test.cpp), whether or not the build has the CUDA plugins.
#include "../conformance/wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "test_cuda_only", "version": "1.0.0",
  "providers": [
    {"kind": "kernel", "op": "moe.experts", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "dequant", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "norm_rope", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "attention", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "linear.lora", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "rms_norm", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "swiglu", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "linear_ce", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "moe.mlp", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "linear_attention", "name": "cuda_only", "requires": {"devices": ["cuda"]}},
    {"kind": "kernel", "op": "causal_conv1d", "name": "cuda_only", "requires": {"devices": ["cuda"]}}
  ]
})")

AXENGINE_PLUGIN_REGISTER(reg) {
  reg.kernel<ax::ops::MoeExperts>("cuda_only", std::make_shared<axtest::MoeWrap>());
  reg.kernel<ax::ops::Dequant>("cuda_only", std::make_shared<axtest::DequantWrap>());
  reg.kernel<ax::ops::NormRope>("cuda_only", std::make_shared<axtest::NormRopeWrap>());
  reg.kernel<ax::ops::Attention>("cuda_only", std::make_shared<axtest::AttentionWrap>());
  reg.kernel<ax::ops::LinearLora>("cuda_only", std::make_shared<axtest::LinearLoraWrap>());
  reg.kernel<ax::ops::RmsNorm>("cuda_only", std::make_shared<axtest::RmsNormWrap>());
  reg.kernel<ax::ops::Swiglu>("cuda_only", std::make_shared<axtest::SwigluWrap>());
  reg.kernel<ax::ops::LinearCe>("cuda_only", std::make_shared<axtest::LinearCeWrap>());
  reg.kernel<ax::ops::MoeMlp>("cuda_only", std::make_shared<axtest::MoeMlpWrap>());
  reg.kernel<ax::ops::LinearAttention>("cuda_only", std::make_shared<axtest::LinearAttentionWrap>());
  reg.kernel<ax::ops::CausalConv1d>("cuda_only", std::make_shared<axtest::CausalConv1dWrap>());
}
