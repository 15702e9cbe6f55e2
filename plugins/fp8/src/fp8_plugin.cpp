// The fp8 plugin: a CUDA kernel for fine-grained FP8 weights (WeightFormat::fp8, docs/ops/dequant.md):
//   dequant  fp8 + block scales -> fp32/bf16/fp16, whole or selective (kernels/fp8_dequant.cu), bit-exact with
//            ops::dequantize
// docs/plugins/fp8.md.
#include <axengine/plugin.hpp>

#include "fp8_plugin.hpp"

// graph_safe: no host synchronisation (the selective ids are read on the device).
// clang-format off
AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"fp8\", \"version\": \"0.1.0\","
    " \"summary\": \"CUDA kernel for fine-grained FP8 weights: dequantisation with block scales\","
    " \"providers\": ["
    "{\"kind\": \"kernel\", \"op\": \"dequant\", \"name\": \"fp8\", \"graph_safe\": true,"
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"fp32\", \"bf16\", \"fp16\"],"
    " \"formats\": [\"fp8\"]}}]}")
// clang-format on

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::Dequant>("fp8", ax::fp8::make_dequant()); }
