// The sparse MLP of qwen3_moe, mixtral, olmoe, qwen3_5_moe and qwen3_next (MoeKind::softmax_topk): router
// mlp.gate (no bias) → softmax in fp32 → top-k, renormalised when norm_topk_prob; the routed experts a SiLU GLU
// with gate_up_proj = [gate; up] halves (parts/routed_experts.hpp). Its router logits feed transformers'
// load-balancing aux loss (DecoderModel::aux_loss, here: gpt_oss's router feeds it too).
#include <ATen/ATen.h>

#include "axengine/ops/moe_mlp.hpp"
#include "models/decoder.hpp"
#include "models/parts/routed_experts.hpp"

namespace ax::models {

namespace {

void moe_softmax_topk_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  out.push_back({prefix + "mlp.gate.weight", {c.num_experts, c.hidden_size}});
  routed_experts_tensors(c, prefix, out);
}

// Tokens per expert, int64 [E]. Not at::bincount: on CUDA it reads the largest index back to size its
// output (a host sync per MoE layer); the counts are integers, so the sum is exact in any order.
at::Tensor expert_counts(const at::Tensor& expert_idx, int64_t E) {
  return at::zeros({E}, expert_idx.options().dtype(at::kLong)).scatter_add_(0, expert_idx, at::ones_like(expert_idx, at::kLong));
}

}  // namespace

at::Tensor DecoderModel::moe_block(int64_t i, const at::Tensor& x, std::vector<at::Tensor>& router_logits) {
  const std::string p = layer_prefix(i) + "mlp.";
  const int64_t k = cfg_.top_k;
  at::Tensor logits = at::linear(x, w(p + "gate.weight"));  // [T, E]
  router_logits.push_back(logits);
  at::Tensor probs = at::softmax(logits, -1, at::kFloat);  // fp32 math and output; the cast rides in the kernel
  auto [top_v, top_i] = at::topk(probs, k, -1);
  if (cfg_.norm_topk_prob) top_v = top_v / top_v.sum(-1, true);
  top_v = top_v.to(x.scalar_type());

  ops::MoeMlpArgs a;
  a.x = x;
  a.routing = moe_routing(top_i);
  a.gates = top_v;
  a.activation = ops::MoeActivation::silu_glu;  // gate in the first I columns of gate_up_proj, up in the last I
  a.packing = ops::GluPacking::halves;
  return expert_mlp(std::move(a), p + "experts.");  // [T, H]
}

at::Tensor DecoderModel::aux_loss(const std::vector<at::Tensor>& router_logits, const at::Tensor& mask) const {
  // transformers' load_balancing_loss_func: E · Σ_e f_e · P_e over all layers' tokens, f_e = share of top-k
  // assignments, P_e = mean router probability; with an attention mask (fp32 [T], 0 at padding) both are
  // weighted by it, so padding counts neither in the sums nor in the token count.
  // All layers in one pass over their concatenated logits, as transformers concatenates them: one softmax,
  // top-k, count and sum instead of one of each per layer (the sums' order differs from a per-layer loop,
  // so the fp32 prob_sum may differ in its last bits; counts and row counts are exact integers).
  const int64_t E = cfg_.num_experts, L = static_cast<int64_t>(router_logits.size());
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  at::Tensor l = L == 1 ? router_logits[0] : at::cat(router_logits, 0);  // [L·T, E]
  at::Tensor rw = at::softmax(l, -1);
  at::Tensor sel = std::get<1>(at::topk(rw, cfg_.top_k, -1)).reshape({-1});
  at::Tensor counts, prob_sum, rows;
  if (mask.defined()) {
    at::Tensor m = L == 1 ? mask : mask.repeat({L});  // [L·T]
    counts = at::zeros({E}, f32).scatter_add_(0, sel, m.repeat_interleave(cfg_.top_k));
    prob_sum = (rw.to(at::kFloat) * m.unsqueeze(-1)).sum(0);
    rows = m.sum();
  } else {
    counts = expert_counts(sel, E).to(at::kFloat);
    prob_sum = rw.to(at::kFloat).sum(0);
    rows = at::full({}, static_cast<double>(l.size(0)), f32);  // a device tensor: true division, as before
  }
  return (counts / rows * (prob_sum / rows)).sum() * double(E);
}

const FfnPart& Parts::moe_softmax_topk() {
  static const FfnPart p{{"moe_softmax_topk", moe_softmax_topk_tensors, routed_experts_lora_sites, routed_experts_calls},
                         &DecoderModel::moe_block,
                         true};
  return p;
}

}  // namespace ax::models
