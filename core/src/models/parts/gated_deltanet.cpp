#include "models/parts/gated_deltanet.hpp"

#include <optional>
#include <tuple>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "models/parts/gdn_context_parallel.hpp"

namespace ax::models {

namespace {

struct GdnSizes {
  int64_t Hk, Hv, Dk, Dv, W, key, value, conv;
};
GdnSizes gdn_sizes(const HfConfig& c) {
  const auto& g = c.gdn;
  const int64_t key = g.key_heads * g.key_dim, value = g.value_heads * g.value_dim;
  return {g.key_heads, g.value_heads, g.key_dim, g.value_dim, g.conv_kernel, key, value, 2 * key + value};
}

// The input projections (leaf, rows): Qwen3.5's four, or Qwen3-Next's two fused ones (HfConfig::gdn.fused).
std::vector<std::pair<const char*, int64_t>> in_projections(const HfConfig& c) {
  const GdnSizes s = gdn_sizes(c);
  if (c.gdn.fused) return {{"in_proj_qkvz", s.conv + s.value}, {"in_proj_ba", 2 * s.Hv}};
  return {{"in_proj_qkv", s.conv}, {"in_proj_z", s.value}, {"in_proj_b", s.Hv}, {"in_proj_a", s.Hv}};
}

}  // namespace

void gated_deltanet_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const GdnSizes s = gdn_sizes(c);
  const int64_t H = c.hidden_size;
  const std::string p = prefix + "linear_attn.";
  for (const auto& [leaf, rows] : in_projections(c)) out.push_back({p + leaf + ".weight", {rows, H}});
  out.push_back({p + "conv1d.weight", {s.conv, 1, s.W}});  // nn.Conv1d's depthwise [C, 1, W]
  out.push_back({p + "A_log", {s.Hv}});
  out.push_back({p + "dt_bias", {s.Hv}});
  out.push_back({p + "norm.weight", {s.Dv}});
  out.push_back({p + "out_proj.weight", {H, s.value}});
}

void gated_deltanet_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  const GdnSizes s = gdn_sizes(c);
  const int64_t H = c.hidden_size;
  const std::string p = prefix + "linear_attn.";
  for (const auto& [leaf, rows] : in_projections(c)) out.push_back(LoraSite{p + leaf, leaf, false, 1, H, rows});
  out.push_back(LoraSite{p + "out_proj", "out_proj", false, 1, s.value, H});
}

void gated_deltanet_calls(const HfConfig& c, const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
                          std::vector<OpCall>& out) {
  const std::string p = prefix + "linear_attn.";
  auto projections = in_projections(c);
  projections.push_back({"out_proj", 0});
  for (const auto& [proj, rows] : projections)
    out.push_back({"linear.lora", ops::to_string(formats.at(p + proj + ".weight")), ""});
  out.push_back({"causal_conv1d", "", ""});
  out.push_back({"linear_attention", "", ""});
  // The gated RMSNorm: rms_norm (no 1 + w) then swiglu with the gate z.
  out.push_back({"rms_norm", "", ""});
  out.push_back({"swiglu", "", ""});
}

std::shared_ptr<ops::LinearAttention> DecoderModel::linear_attention_backend() {
  if (!linear_attention_chain_) {
    std::vector<ops::NamedLinearAttention> named;
    for (auto& [n, b] : kernels_->get_all<ops::LinearAttention>(ops::dtype_name(dtype_), "", "")) named.push_back({n, b});
    linear_attention_chain_ = ops::linear_attention_chain(std::move(named));
  }
  return linear_attention_chain_;
}

at::Tensor DecoderModel::gated_deltanet_block(int64_t i, const at::Tensor& x, const LayerInputs& in) {
  const at::Tensor& cu = in.cu;
  const GdnSizes s = gdn_sizes(cfg_);
  const std::string p = str("model.layers.", i, ".linear_attn.");
  const int64_t T = x.size(0);
  at::Tensor qkv, z, b, a;
  if (cfg_.gdn.fused) {
    // Qwen3-Next (fix_query_key_value_ordering): in_proj_qkvz's rows are Hk groups of [q Dk | k Dk | v r·Dv |
    // z r·Dv] and in_proj_ba's Hk groups of [b r | a r], r = Hv / Hk value heads per key head; value head
    // j·r + i is the i-th of group j. Regrouped into Qwen3.5's layout: qkv = [q all heads | k | v], z, b, a.
    const int64_t r = s.Hv / s.Hk;
    const auto parts = linear(x, p + "in_proj_qkvz").reshape({T, s.Hk, 2 * s.Dk + 2 * r * s.Dv}).split_with_sizes({s.Dk, s.Dk, r * s.Dv, r * s.Dv}, 2);
    qkv = at::cat({parts[0].reshape({T, s.key}), parts[1].reshape({T, s.key}), parts[2].reshape({T, s.value})}, 1);
    z = parts[3].reshape({T, s.value});
    const at::Tensor ba = linear(x, p + "in_proj_ba").reshape({T, s.Hk, 2 * r});
    b = ba.narrow(2, 0, r).reshape({T, s.Hv});
    a = ba.narrow(2, r, r).reshape({T, s.Hv});
  } else {
    qkv = linear(x, p + "in_proj_qkv");
    z = linear(x, p + "in_proj_z");
    b = linear(x, p + "in_proj_b");
    a = linear(x, p + "in_proj_a");
  }

  ops::CausalConv1dArgs conv;
  conv.x = qkv;
  conv.weight = w(p + "conv1d.weight").view({s.conv, s.W});
  conv.cu_seqlens = cu;
  conv.check_values = false;  // cu_seqlens were validated when the batch was built
  at::Tensor state;
  if (decode_step_) {  // decode: each row continues from its cached window and state
    std::tie(conv.initial_state, state) = cached_linear_state(i);
    conv.output_final_state = true;
  }
  // Context parallelism: this rank's chunks of every row, each from the window and state the row's chunk before
  // it leaves (parts/gdn_context_parallel.hpp); x holds this rank's tokens, the split the whole batch's samples
  // (on the host: cu stays unread).
  std::optional<GdnContextSplit> cp;
  if (cp_split_) cp.emplace(*cp_split_);
  const auto conv_op = kernels_->get<ops::CausalConv1d>(ops::dtype_name(dtype_));
  autograd::CausalConv1dOutput c = cp ? autograd::CausalConv1dOutput{cp->conv1d(conv_op, std::move(conv)), at::Tensor()}
                                      : autograd::causal_conv1d(conv_op, std::move(conv));
  const at::Tensor& y = c.y;

  ops::LinearAttentionArgs la;
  la.q = y.narrow(1, 0, s.key).reshape({T, s.Hk, s.Dk});
  la.k = y.narrow(1, s.key, s.key).reshape({T, s.Hk, s.Dk});
  la.v = y.narrow(1, 2 * s.key, s.value).reshape({T, s.Hv, s.Dv});
  la.beta = at::sigmoid(b);
  // transformers: -A_log.float().exp() * softplus(a.float() + dt_bias), in fp32 whatever the compute dtype.
  la.g = -at::exp(w(p + "A_log").to(at::kFloat)) * at::softplus(a.to(at::kFloat) + w(p + "dt_bias").to(at::kFloat));
  la.cu_seqlens = cu;
  la.qk_l2norm = true;
  la.check_values = false;
  la.initial_state = state;
  la.output_final_state = decode_step_ != nullptr;
  auto r = cp ? autograd::LinearAttentionOutput{cp->linear_attention(linear_attention_backend(), std::move(la)), at::Tensor()}
              : autograd::linear_attention(linear_attention_backend(), std::move(la));
  if (decode_step_) store_linear_state(i, c.final_state, r.final_state);
  const at::Tensor& o = r.out;  // [T, Hv, Dv]

  // Qwen3_5RMSNormGated: w · RMSNorm(o) (in the compute dtype, no 1 + w), times silu(z) in fp32.
  ops::RmsNormArgs n;
  n.x = o.reshape({T * s.Hv, s.Dv});
  n.weight = w(p + "norm.weight");
  n.eps = cfg_.rms_norm_eps;
  n.weight_offset = false;
  at::Tensor normed = autograd::rms_norm(kernels_->get<ops::RmsNorm>(ops::dtype_name(dtype_)), std::move(n)).y;
  ops::SwigluArgs g;
  g.gate = z.reshape({T * s.Hv, s.Dv});
  g.up = normed;
  at::Tensor gated = autograd::swiglu(kernels_->get<ops::Swiglu>(ops::dtype_name(dtype_)), std::move(g));
  return linear(gated.reshape({T, s.value}), p + "out_proj");
}

namespace {
// Decode keeps each row's conv window (the last W-1 inputs) and recurrent state, fp32: O(1) per token.
MixerCache gated_deltanet_cache(const HfConfig& c, int64_t batch, int64_t) {
  const GdnSizes s = gdn_sizes(c);
  return {{}, {}, {batch, s.W - 1, s.conv}, {batch, s.Hv, s.Dk, s.Dv}};
}
}  // namespace

const MixerPart& Parts::gated_deltanet() {
  static const MixerPart p{{"gated_deltanet", gated_deltanet_tensors, gated_deltanet_lora_sites, gated_deltanet_calls},
                           &DecoderModel::gated_deltanet_block,
                           gated_deltanet_cache};
  return p;
}

}  // namespace ax::models
