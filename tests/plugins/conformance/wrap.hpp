// Shared by the conformance self-test plugins: backends that forward every call to the built-in
// `reference` backend, so each plugin can plant exactly one bug by overriding one step.
//
// The reference objects come through public API only (ax::register_builtins into a private registry),
// the way any plugin could reach them.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>

#include <axengine/builtins.hpp>
#include <axengine/ops/attention.hpp>
#include <axengine/ops/causal_conv1d.hpp>
#include <axengine/ops/dequant.hpp>
#include <axengine/ops/linear_attention.hpp>
#include <axengine/ops/linear_ce.hpp>
#include <axengine/ops/linear_lora.hpp>
#include <axengine/ops/moe_experts.hpp>
#include <axengine/ops/moe_mlp.hpp>
#include <axengine/ops/norm_rope.hpp>
#include <axengine/ops/rms_norm.hpp>
#include <axengine/ops/swiglu.hpp>
#include <axengine/plugin.hpp>

namespace axtest {

template <class Op>
std::shared_ptr<Op> reference() {
  // Never destroyed: the plugin may be unloaded after the host's static destructors ran.
  static ax::Registry* registry = [] {
    auto* r = new ax::Registry;
    ax::register_builtins(*r);
    return r;
  }();
  auto op = registry->kernel<Op>("reference");
  if (!op) throw std::runtime_error(std::string("no reference backend for ") + Op::kOp);
  return op;
}

struct MoeWrap : ax::ops::MoeExperts {
 protected:
  ax::ops::MoeExpertsResult run_forward(const ax::ops::MoeExpertsArgs& a) override {
    return reference<MoeExperts>()->forward(a);
  }
  ax::ops::MoeExpertsGrads run_backward(const ax::ops::MoeExpertsArgs& a, const ax::ops::MoeExpertsBackwardArgs& b) override {
    return reference<MoeExperts>()->backward(a, b);
  }
};

struct DequantWrap : ax::ops::Dequant {
 protected:
  at::Tensor run(const ax::ops::DequantArgs& a) override { return reference<Dequant>()->dequantize(a); }
};

struct NormRopeWrap : ax::ops::NormRope {
 protected:
  at::Tensor run_forward(const ax::ops::NormRopeArgs& a) override { return reference<NormRope>()->forward(a); }
  ax::ops::NormRopeGrads run_backward(const ax::ops::NormRopeArgs& a, const ax::ops::NormRopeBackwardArgs& b) override {
    return reference<NormRope>()->backward(a, b);
  }
};

struct AttentionWrap : ax::ops::Attention {
 protected:
  ax::ops::AttentionResult run_forward(const ax::ops::AttentionArgs& a) override {
    return reference<Attention>()->forward(a);
  }
  ax::ops::AttentionGrads run_backward(const ax::ops::AttentionArgs& a, const ax::ops::AttentionBackwardArgs& b) override {
    return reference<Attention>()->backward(a, b);
  }
};

struct LinearLoraWrap : ax::ops::LinearLora {
 protected:
  at::Tensor run_forward(const ax::ops::LinearLoraArgs& a) override { return reference<LinearLora>()->forward(a); }
  ax::ops::LinearLoraGrads run_backward(const ax::ops::LinearLoraArgs& a, const ax::ops::LinearLoraBackwardArgs& b) override {
    return reference<LinearLora>()->backward(a, b);
  }
};

struct RmsNormWrap : ax::ops::RmsNorm {
 protected:
  ax::ops::RmsNormResult run_forward(const ax::ops::RmsNormArgs& a) override { return reference<RmsNorm>()->forward(a); }
  ax::ops::RmsNormGrads run_backward(const ax::ops::RmsNormArgs& a, const ax::ops::RmsNormBackwardArgs& b) override {
    return reference<RmsNorm>()->backward(a, b);
  }
};

struct SwigluWrap : ax::ops::Swiglu {
 protected:
  at::Tensor run_forward(const ax::ops::SwigluArgs& a) override { return reference<Swiglu>()->forward(a); }
  ax::ops::SwigluGrads run_backward(const ax::ops::SwigluArgs& a, const ax::ops::SwigluBackwardArgs& b) override {
    return reference<Swiglu>()->backward(a, b);
  }
};

struct LinearCeWrap : ax::ops::LinearCe {
 protected:
  ax::ops::LinearCeResult run_forward(const ax::ops::LinearCeArgs& a) override { return reference<LinearCe>()->forward(a); }
  at::Tensor run_backward(const ax::ops::LinearCeArgs& a, const ax::ops::LinearCeBackwardArgs& b) override {
    return reference<LinearCe>()->backward(a, b);
  }
};

struct MoeMlpWrap : ax::ops::MoeMlp {
 protected:
  ax::ops::MoeMlpResult run_forward(const ax::ops::MoeMlpArgs& a) override { return reference<MoeMlp>()->forward(a); }
  ax::ops::MoeMlpGrads run_backward(const ax::ops::MoeMlpArgs& a, const ax::ops::MoeMlpBackwardArgs& b) override {
    return reference<MoeMlp>()->backward(a, b);
  }
};

struct LinearAttentionWrap : ax::ops::LinearAttention {
 protected:
  ax::ops::LinearAttentionResult run_forward(const ax::ops::LinearAttentionArgs& a) override {
    return reference<LinearAttention>()->forward(a);
  }
  ax::ops::LinearAttentionGrads run_backward(const ax::ops::LinearAttentionArgs& a,
                                             const ax::ops::LinearAttentionBackwardArgs& b) override {
    return reference<LinearAttention>()->backward(a, b);
  }
};

struct CausalConv1dWrap : ax::ops::CausalConv1d {
 protected:
  ax::ops::CausalConv1dResult run_forward(const ax::ops::CausalConv1dArgs& a) override {
    return reference<CausalConv1d>()->forward(a);
  }
  ax::ops::CausalConv1dGrads run_backward(const ax::ops::CausalConv1dArgs& a, const ax::ops::CausalConv1dBackwardArgs& b) override {
    return reference<CausalConv1d>()->backward(a, b);
  }
};

}  // namespace axtest
