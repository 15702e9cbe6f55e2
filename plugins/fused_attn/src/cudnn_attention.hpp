// attention through cuDNN's fused flash attention (cudnn_attention.cpp): built when cmake finds the cuDNN
// frontend headers and library (AXENGINE_WITH_CUDNN_ATTENTION, cmake/AxCudnnAttention.cmake).
#pragma once
#include <axengine/ops/attention.hpp>

#include <memory>
#include <string>

namespace ax::fused_attn {

// Why cuDNN's ragged kernels cannot take this call (empty when they can): the calls the backend declines.
std::string cudnn_attention_unfit(const ops::AttentionArgs& a);
std::shared_ptr<ops::Attention> make_cudnn_attention();

}  // namespace ax::fused_attn
