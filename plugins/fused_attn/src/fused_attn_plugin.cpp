// The fused_attn plugin: CUDA backends of five core ops, each certified by the conformance suite
// (docs/plugins/fused_attn.md):
//   norm_rope  RMSNorm over head_dim + rotate-half RoPE in one launch each way (kernels/norm_rope.cu), sm_80+ as the next three
//   rms_norm   residual add + RMSNorm (kernels/rms_norm.cu)
//   swiglu     silu(gate)·up, gate/up views or one gate_up tensor (kernels/swiglu.cu)
//   linear_ce  LM head + cross-entropy in chunks of tokens, logits never whole (linear_ce.cpp)
//   attention  cuDNN's fused flash attention over packed sequences (cudnn_attention.cpp), sm_90+, bf16/fp16,
//              where the build found cuDNN's frontend headers; it declines what its kernels do not cover
// Weight gradients reduce over rows through fixed-size per-block partials summed in a fixed order: every
// output is bitwise reproducible. No host synchronisation on any path, hence graph_safe.
#include <axengine/plugin.hpp>

#include "backends.hpp"
#ifdef AXENGINE_WITH_CUDNN_ATTENTION
#include "cudnn_attention.hpp"
#endif

// (Plain literals: a multi-line raw string inside a macro argument trips some preprocessors.)
// clang-format off
#define FUSED_ATTN_REQUIRES \
  " \"graph_safe\": true," \
  " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"fp32\", \"bf16\", \"fp16\"]}}"
// cuDNN's ragged (THD) attention kernels need Hopper; fp32 is not among their types.
#ifdef AXENGINE_WITH_CUDNN_ATTENTION
#define FUSED_ATTN_ATTENTION \
  ", {\"kind\": \"kernel\", \"op\": \"attention\", \"name\": \"fused_attn\", \"graph_safe\": true," \
  " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_90\", \"dtypes\": [\"bf16\", \"fp16\"]," \
  " \"layouts\": [\"plain\"]}}"
#else
#define FUSED_ATTN_ATTENTION ""
#endif
AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"fused_attn\", \"version\": \"0.1.0\","
    " \"summary\": \"fused CUDA kernels of the block's memory-bound ops: q/k norm + RoPE, residual RMSNorm, SwiGLU,"
    " LM head + cross-entropy\","
    " \"providers\": ["
    "{\"kind\": \"kernel\", \"op\": \"norm_rope\", \"name\": \"fused_attn\"," FUSED_ATTN_REQUIRES ","
    "{\"kind\": \"kernel\", \"op\": \"rms_norm\", \"name\": \"fused_attn\"," FUSED_ATTN_REQUIRES ","
    "{\"kind\": \"kernel\", \"op\": \"swiglu\", \"name\": \"fused_attn\"," FUSED_ATTN_REQUIRES ","
    "{\"kind\": \"kernel\", \"op\": \"linear_ce\", \"name\": \"fused_attn\"," FUSED_ATTN_REQUIRES
    FUSED_ATTN_ATTENTION "]}")
// clang-format on

AXENGINE_PLUGIN_REGISTER(reg) {
  using namespace ax::fused_attn;
  auto ctx = std::make_shared<Context>();
  reg.kernel<ax::ops::NormRope>("fused_attn", make_norm_rope());
  reg.kernel<ax::ops::RmsNorm>("fused_attn", make_rms_norm());
  reg.kernel<ax::ops::Swiglu>("fused_attn", make_swiglu());
  reg.kernel<ax::ops::LinearCe>("fused_attn", make_linear_ce(ctx));
#ifdef AXENGINE_WITH_CUDNN_ATTENTION
  reg.kernel<ax::ops::Attention>("fused_attn", make_cudnn_attention());
#endif
  reg.backend_options<Options>("fused_attn",
                               "options of the fused_attn backends; docs/plugins/fused_attn.md, section Options",
                               bind_options, [ctx](const Options& o) { ctx->options = o; });
}
