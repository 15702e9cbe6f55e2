// gpt_oss's MoE block (transformers' GptOssMLP): the router in plain ATen, the experts one moe.mlp call.
//   logits = x·Wrᵀ + br                                  [T, E]   (router with bias)
//   (v, e) = topk(logits, k);  g = softmax(v)             softmax over the k chosen logits only
//   gu     = x·W1[e] + b1[e]                              per-expert gate_up bias, gate/up interleaved
//   gate   = gu[:, 0::2].clamp(max = limit),  up = gu[:, 1::2].clamp(−limit, limit)
//   h      = (up + 1) · gate · σ(alpha · gate)            moe.mlp's clamped_glu
//   out_t  = Σ_j g_tj · (h_tj·W2[e_tj] + b2[e_tj])        the down bias enters the gated sum, as transformers
//                                                          adds it before weighting by the routing score
#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/strings.hpp"
#include "axengine/selection.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "models/gpt_oss.hpp"
#include "models/parts/routed_experts.hpp"

namespace ax::models {

namespace {
bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
}  // namespace

void gpt_oss_moe_tensors(const HfConfig& c, const std::string& p, std::vector<std::pair<std::string, std::vector<int64_t>>>& out) {
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  out.push_back({p + "mlp.router.weight", {E, H}});
  out.push_back({p + "mlp.router.bias", {E}});
  out.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * I, H}});  // ENK; the checkpoint's is [E, H, 2I]
  out.push_back({p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}});
  out.push_back({p + "mlp.experts.down_proj", {E, H, I}});  // ENK; the checkpoint's is [E, I, H]
  out.push_back({p + "mlp.experts.down_proj_bias", {E, H}});
}

bool gpt_oss_transposed(const std::string& name) {
  return ends_with(name, "mlp.experts.gate_up_proj") || ends_with(name, "mlp.experts.down_proj");
}

std::vector<int64_t> gpt_oss_checkpoint_shape(const std::string& name, std::vector<int64_t> shape) {
  if (gpt_oss_transposed(name) && shape.size() == 3) std::swap(shape[1], shape[2]);
  return shape;
}

at::Tensor gpt_oss_from_checkpoint(const std::string& name, const at::Tensor& t) {
  return gpt_oss_transposed(name) ? t.transpose(1, 2).contiguous() : t;
}

at::Tensor gpt_oss_to_checkpoint(const std::string& name, const at::Tensor& t) {
  return gpt_oss_transposed(name) ? t.transpose(1, 2).contiguous() : t;
}

namespace {
std::string dims(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}
}  // namespace

void check_gpt_oss_mxfp4(const safetensors::Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
                         const std::string& source) {
  const int64_t E = shape[0], N = shape[1], K = shape[2];
  const std::string bk = name + "_blocks", sk = name + "_scales";
  for (const auto& key : {bk, sk})
    if (!ckpt.has(key))
      throw UsageError(str(ckpt.source(), ": tensor '", key, "' is missing (", source,
                           " has quant_method mxfp4; its pair is ", key == bk ? sk : bk, ")"));
  if (K % 32 != 0)
    throw UsageError(str(ckpt.file_of(bk), ": tensor '", bk, "': the reduction dim ", K, " of ", name,
                         " is not a multiple of the MXFP4 block of 32"));
  const std::vector<int64_t> want_b = {E, N, K / 32, 16}, want_s = {E, N, K / 32};
  for (const auto& [key, want] : {std::pair{bk, want_b}, std::pair{sk, want_s}}) {
    const auto& info = ckpt.info(key);
    if (info.scalar_type != at::kByte)
      throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has dtype ", info.dtype, ", MXFP4 ",
                           key == bk ? "blocks" : "scales", " are U8"));
    if (info.shape != want)
      throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has shape ", dims(info.shape), " but ", source,
                           " implies ", dims(want), " (", key == bk ? "[experts, rows, K/32 blocks, 16 bytes]"
                                                                     : "[experts, rows, K/32 blocks]", ")"));
  }
}

ops::WeightTensor read_gpt_oss_mxfp4(const safetensors::Checkpoint& ckpt, const std::string& name,
                                     const std::vector<int64_t>& shape, const std::string& source) {
  check_gpt_oss_mxfp4(ckpt, name, shape, source);
  const int64_t E = shape[0], N = shape[1], K = shape[2];
  const std::string bk = name + "_blocks", sk = name + "_scales";
  ops::WeightTensor w;
  w.format = ops::WeightFormat::mxfp4;
  w.shape = shape;
  w.codes = ckpt.get(bk).reshape({E, N, K / 2});  // the blocks back to back along K: a view, nothing decoded
  w.scales = ckpt.get(sk);
  w.blocksize = 32;
  w.axis = 2;
  ops::validate_weight(w, str(ckpt.file_of(bk), ": '", name, "'"));
  return w;
}

at::Tensor DecoderModel::gpt_oss_moe_block(int64_t i, const at::Tensor& x, std::vector<at::Tensor>& router_logits) {
  const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
  const int64_t k = cfg_.top_k;
  at::Tensor logits = at::linear(x, w(p + "router.weight"), w(p + "router.bias"));  // [T, E]
  router_logits.push_back(logits);  // the aux loss is transformers' load_balancing_loss_func on these
  auto [top_v, top_i] = at::topk(logits, k, -1);
  // transformers: softmax(router_top_value, dim=1, dtype=router_top_value.dtype), in the compute dtype.
  at::Tensor gates = at::softmax(top_v, -1);

  ops::MoeMlpArgs a;
  a.x = x;
  a.routing = moe_routing(top_i);
  a.gates = gates;
  a.gate_up_bias = w(p + "experts.gate_up_proj_bias");
  a.down_bias = w(p + "experts.down_proj_bias");  // enters the gated sum, as transformers adds it before weighting
  a.activation = ops::MoeActivation::clamped_glu;
  a.packing = ops::GluPacking::interleaved;  // gate = gu[..., ::2], up = gu[..., 1::2]
  a.alpha = cfg_.swiglu_alpha;
  a.limit = cfg_.swiglu_limit;
  return expert_mlp(std::move(a), p + "experts.");  // [T, H]
}

const FfnPart& Parts::moe_gpt_oss() {
  static const FfnPart p{{"moe_gpt_oss", gpt_oss_moe_tensors, routed_experts_lora_sites, routed_experts_calls},
                         &DecoderModel::gpt_oss_moe_block,
                         true};
  return p;
}

}  // namespace ax::models
