// The fused_attn backends, one per op (each in its own <op>.cpp); fused_attn_plugin.cpp registers them.
#pragma once
#include <axengine/ops/linear_ce.hpp>
#include <axengine/ops/norm_rope.hpp>
#include <axengine/ops/rms_norm.hpp>
#include <axengine/ops/swiglu.hpp>
#include <memory>

#include "glue.hpp"

namespace ax::fused_attn {

// The backends' bodies, for callers that hold arguments validate() already passed (the backends below,
// and bench/fused_attn_bench.cpp, which times the kernels without the plugin loader in between).
at::Tensor norm_rope_forward(const ops::NormRopeArgs& a);
ops::NormRopeGrads norm_rope_backward(const ops::NormRopeArgs& a, const ops::NormRopeBackwardArgs& b);
ops::RmsNormResult rms_norm_forward(const ops::RmsNormArgs& a);
ops::RmsNormGrads rms_norm_backward(const ops::RmsNormArgs& a, const ops::RmsNormBackwardArgs& b);
at::Tensor swiglu_forward(const ops::SwigluArgs& a);
ops::SwigluGrads swiglu_backward(const ops::SwigluArgs& a, const ops::SwigluBackwardArgs& b);
ops::LinearCeResult linear_ce_forward(const ops::LinearCeArgs& a, const Options& o);
at::Tensor linear_ce_backward(const ops::LinearCeArgs& a, const ops::LinearCeBackwardArgs& b, const Options& o);

// The backend objects the plugin registers.
std::shared_ptr<ops::NormRope> make_norm_rope();
std::shared_ptr<ops::RmsNorm> make_rms_norm();
std::shared_ptr<ops::Swiglu> make_swiglu();
std::shared_ptr<ops::LinearCe> make_linear_ce(std::shared_ptr<const Context> ctx);

}  // namespace ax::fused_attn
