// The control: every op forwarded unchanged to the reference. It must pass every conformance case.
#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_correct", "version": "1.0.0",
  "providers": [
    {"kind": "kernel", "op": "moe.experts", "name": "conf_correct", "requires": {"devices": ["cpu"]}},
    {"kind": "kernel", "op": "dequant", "name": "conf_correct", "requires": {"devices": ["cpu"]}},
    {"kind": "kernel", "op": "norm_rope", "name": "conf_correct", "requires": {"devices": ["cpu"]}},
    {"kind": "kernel", "op": "attention", "name": "conf_correct", "requires": {"devices": ["cpu"]}},
    {"kind": "kernel", "op": "linear.lora", "name": "conf_correct", "requires": {"devices": ["cpu"]}},
    {"kind": "kernel", "op": "linear_attention", "name": "conf_correct", "requires": {"devices": ["cpu"]}},
    {"kind": "kernel", "op": "causal_conv1d", "name": "conf_correct", "requires": {"devices": ["cpu"]}}
  ]
})")

AXENGINE_PLUGIN_REGISTER(reg) {
  reg.kernel<ax::ops::MoeExperts>("conf_correct", std::make_shared<axtest::MoeWrap>());
  reg.kernel<ax::ops::Dequant>("conf_correct", std::make_shared<axtest::DequantWrap>());
  reg.kernel<ax::ops::NormRope>("conf_correct", std::make_shared<axtest::NormRopeWrap>());
  reg.kernel<ax::ops::Attention>("conf_correct", std::make_shared<axtest::AttentionWrap>());
  reg.kernel<ax::ops::LinearLora>("conf_correct", std::make_shared<axtest::LinearLoraWrap>());
  reg.kernel<ax::ops::LinearAttention>("conf_correct", std::make_shared<axtest::LinearAttentionWrap>());
  reg.kernel<ax::ops::CausalConv1d>("conf_correct", std::make_shared<axtest::CausalConv1dWrap>());
}
