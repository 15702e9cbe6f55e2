// The gdn plugin: a CUDA backend of linear_attention (the gated delta rule of Gated DeltaNet layers,
// docs/ops/linear_attention.md): core's shared chunked form with its two scans as kernels (docs/plugins/gdn.md).
// sm_80 or newer (PTX for sm_80, native sm_90a / sm_120), fp32 / bf16 / fp16 (the scans in fp32, an fp32
// state); graph-safe: no host sync, every grid from shapes.
#include <axengine/plugin.hpp>

#include "linear_attention.hpp"

// clang-format off
AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"gdn\", \"version\": \"0.1.0\","
    " \"summary\": \"CUDA kernels for Gated DeltaNet: the chunked gated delta rule (linear_attention)\","
    " \"providers\": ["
    "{\"kind\": \"kernel\", \"op\": \"linear_attention\", \"name\": \"gdn\", \"graph_safe\": true,"
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"fp32\", \"bf16\", \"fp16\"]}}]}")
// clang-format on

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::LinearAttention>("gdn", ax::gdn::make_linear_attention(ax::gdn::cuda_kernels())); }
