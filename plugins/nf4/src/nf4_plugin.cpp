// The nf4 plugin: CUDA providers for QLoRA's NF4 weights (docs/plugins/nf4.md):
//   dequant      nf4 -> fp32/bf16/fp16, plain or double-quantised absmax, whole or selective
//                (kernels/dequant.cu), bit-exact with ops::dequantize
//   quantizer    fp32/bf16/fp16 -> nf4 (kernels/quantize.cu), bit-exact with ops::quantize_nf4
//   linear.lora  the QLoRA linear: ATen GEMMs over chunks of W decoded into one reused buffer (linear.cpp)
// The kernels are the entry points of nf4.hpp, which the PyTorch operators share.
#include <axengine/plugin.hpp>

#include "backends.hpp"

// (Plain literals: a multi-line raw string inside a macro argument trips some preprocessors.)
// graph_safe: dequant and linear.lora never synchronise with the host (the selective ids are read on the
// device). The quantizer reads double quant's offset back (as the reference does); it runs at load time.
// clang-format off
AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"nf4\", \"version\": \"0.1.0\","
    " \"summary\": \"CUDA kernels for NF4 (QLoRA) weights: dequantisation, quantisation, the QLoRA linear\","
    " \"providers\": ["
    "{\"kind\": \"kernel\", \"op\": \"dequant\", \"name\": \"nf4\", \"graph_safe\": true,"
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"fp32\", \"bf16\", \"fp16\"],"
    " \"formats\": [\"nf4\"]}},"
    "{\"kind\": \"kernel\", \"op\": \"linear.lora\", \"name\": \"nf4\", \"graph_safe\": true,"
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"bf16\", \"fp16\"],"
    " \"formats\": [\"nf4\"]}},"
    "{\"kind\": \"quantizer\", \"name\": \"nf4\","
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"formats\": [\"nf4\"]}}]}")
// clang-format on

AXENGINE_PLUGIN_REGISTER(reg) {
  using namespace ax::nf4;
  reg.kernel<ax::ops::Dequant>("nf4", make_dequant());
  reg.kernel<ax::ops::LinearLora>("nf4", make_linear_lora());
  reg.quantizer("nf4", make_quantizer());
}
