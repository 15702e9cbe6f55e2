// One decoder layer's forward: its parts (models/layer_parts.hpp), chosen at construction, joined by the layer's
// norms on the residual stream. Nothing here asks which family or kind of part it runs.
#include <ATen/ATen.h>

#include "models/decoder.hpp"
#include "models/layer_parts.hpp"
#include "models/layer_residency.hpp"
#include "models/tiled_mlp.hpp"

namespace ax::models {

namespace {

void residual_norm_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  out.push_back({prefix + "input_layernorm.weight", {c.hidden_size}});
  out.push_back({prefix + "post_attention_layernorm.weight", {c.hidden_size}});
}

// gemma3_text's second pair, listed after the attention's tensors as its modules are.
void feedforward_norm_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  out.push_back({prefix + "pre_feedforward_layernorm.weight", {c.hidden_size}});
  out.push_back({prefix + "post_feedforward_layernorm.weight", {c.hidden_size}});
}

void norm_calls(const HfConfig&, const std::string&, const HeldFormats&, std::vector<OpCall>& out) {
  out.push_back({"rms_norm", "", ""});
}

}  // namespace

at::Tensor DecoderModel::layer(int64_t i, const at::Tensor& h, const LayerInputs& in, std::vector<at::Tensor>& router_logits) {
  ResidentLayer resident(residency_.get(), i);  // shard_base: the layer's tensors are here only while it runs
  const LayerParts& l = layers_[static_cast<std::size_t>(i)];
  if (!l.local_rope) return (this->*l.norms->forward)(i, l, h, in, router_logits);
  LayerInputs local = in;  // gemma3_text's sliding layers rotate with their own RoPE
  local.inv_freq = inv_freq_local_;
  return (this->*l.norms->forward)(i, l, h, local, router_logits);
}

at::Tensor DecoderModel::feed_forward(int64_t i, const LayerParts& l, const at::Tensor& x, std::vector<at::Tensor>& router_logits) {
  // The feed-forward part (and the shared expert beside it), in token shards with [train] tiled_mlp.
  auto block = [this, i, &l](const at::Tensor& t, std::vector<at::Tensor>& rl) {
    at::Tensor y = (this->*l.ffn->forward)(i, t, rl);
    if (l.shared_expert) y = y + (this->*l.shared_expert->forward)(i, t, rl);
    return y;
  };
  if (!l.ffn->moe || mlp_shard_count(x.size(0)) <= 1) return tiled_mlp(block, x, router_logits);
  // Tiled MoE: packed experts decoded once per pass over the shards, not once per shard (ExpertWeightCache).
  auto cache = std::make_shared<ExpertWeightCache>(mlp_shard_count(x.size(0)));
  return tiled_mlp([block, cache](const at::Tensor& t, std::vector<at::Tensor>& rl) {
                     const ExpertCacheScope scope(cache.get());
                     return block(t, rl);
                   },
                   x, router_logits);
}

at::Tensor DecoderModel::prenorm_layer(int64_t i, const LayerParts& l, const at::Tensor& h, const LayerInputs& in,
                                       std::vector<at::Tensor>& router_logits) {
  const std::string p = layer_prefix(i);
  const at::Tensor a = (this->*l.mixer->forward)(i, rms_norm(h, p + "input_layernorm.weight").first, in);
  // x = h + mixer, then its norm: one rms_norm call with h as the residual (x is its `sum`).
  auto [n, x] = rms_norm(a, p + "post_attention_layernorm.weight", h);
  return x + feed_forward(i, l, n, router_logits);
}

at::Tensor DecoderModel::sandwich_layer(int64_t i, const LayerParts& l, const at::Tensor& h, const LayerInputs& in,
                                        std::vector<at::Tensor>& router_logits) {
  const std::string p = layer_prefix(i);
  const at::Tensor a = (this->*l.mixer->forward)(i, rms_norm(h, p + "input_layernorm.weight").first, in);
  // x = h + norm(mixer); the feed-forward part reads pre_feedforward_layernorm(x) and its output is normed again
  // before the residual add.
  auto [n, x] = rms_norm(rms_norm(a, p + "post_attention_layernorm.weight").first, p + "pre_feedforward_layernorm.weight", h);
  return x + rms_norm(feed_forward(i, l, n, router_logits), p + "post_feedforward_layernorm.weight").first;
}

const NormsPart& Parts::prenorm() {
  static const NormsPart p{{"prenorm", residual_norm_tensors, nullptr, norm_calls}, nullptr, &DecoderModel::prenorm_layer};
  return p;
}

const NormsPart& Parts::sandwich() {
  static const NormsPart p{{"sandwich", residual_norm_tensors, nullptr, norm_calls}, feedforward_norm_tensors,
                           &DecoderModel::sandwich_layer};
  return p;
}

}  // namespace ax::models
