// Multi-head latent attention as a decoder layer's mixer: see mla_layer.hpp.
#include "models/parts/mla_layer.hpp"

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "models/ring_attention.hpp"

namespace ax::models {

MlaOptions mla_options(const HfConfig& c) {
  MlaOptions o;
  o.num_heads = c.num_heads;
  o.q_lora_rank = c.mla.q_lora_rank;
  o.kv_lora_rank = c.mla.kv_lora_rank;
  o.qk_nope_head_dim = c.mla.qk_nope_head_dim;
  o.qk_rope_head_dim = c.mla.qk_rope_head_dim;
  o.v_head_dim = c.mla.v_head_dim;
  o.rope_interleave = c.mla.rope_interleave;
  o.rope_attention_factor = c.rope.attention_factor;
  o.softmax_scale = c.mla.softmax_scale;
  return o;
}

std::vector<std::string> mla_projections(const HfConfig& c) {
  if (c.mla.q_lora_rank > 0) return {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
  return {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
}

void mla_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const auto& m = c.mla;
  const int64_t H = c.hidden_size, Hq = c.num_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const std::string p = prefix + "self_attn.";
  if (m.q_lora_rank > 0) {
    out.push_back({p + "q_a_proj.weight", {m.q_lora_rank, H}});
    if (c.qkv_bias) out.push_back({p + "q_a_proj.bias", {m.q_lora_rank}});
    out.push_back({p + "q_a_layernorm.weight", {m.q_lora_rank}});
    out.push_back({p + "q_b_proj.weight", {Hq * qk, m.q_lora_rank}});
  } else {
    out.push_back({p + "q_proj.weight", {Hq * qk, H}});
  }
  out.push_back({p + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, H}});
  if (c.qkv_bias) out.push_back({p + "kv_a_proj_with_mqa.bias", {m.kv_lora_rank + m.qk_rope_head_dim}});
  out.push_back({p + "kv_a_layernorm.weight", {m.kv_lora_rank}});
  out.push_back({p + "kv_b_proj.weight", {Hq * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}});
  out.push_back({p + "o_proj.weight", {H, Hq * m.v_head_dim}});
  if (c.o_bias) out.push_back({p + "o_proj.bias", {H}});
}

void check_mla_sizes(const HfConfig& c, const safetensors::Checkpoint& ckpt) {
  const auto& m = c.mla;
  const std::string p = "model.layers.0.self_attn.";
  const bool has_q = ckpt.has(p + "q_proj.weight"), has_qa = ckpt.has(p + "q_a_proj.weight");
  if (m.q_lora_rank > 0 && has_q && !has_qa)
    throw UsageError(str(c.source, ": 'q_lora_rank' is ", m.q_lora_rank, " but ", ckpt.file_of(p + "q_proj.weight"), " holds '",
                         p, "q_proj.weight' (a plain q_proj: q_lora_rank null) and no q_a_proj"));
  if (m.q_lora_rank == 0 && has_qa && !has_q)
    throw UsageError(str(c.source, ": 'q_lora_rank' is null but ", ckpt.file_of(p + "q_a_proj.weight"), " holds '", p,
                         "q_a_proj.weight' (q through a LoRA-style down-projection: set q_lora_rank)"));
  const std::string kv_a = p + "kv_a_proj_with_mqa.weight";
  if (!ckpt.has(kv_a)) return;  // the tensor walk names it
  const auto& s = ckpt.info(kv_a).shape;
  if (s.size() == 2 && s[0] != m.kv_lora_rank + m.qk_rope_head_dim)
    throw UsageError(str(c.source, ": 'kv_lora_rank' + 'qk_rope_head_dim' is ", m.kv_lora_rank, " + ", m.qk_rope_head_dim, " = ",
                         m.kv_lora_rank + m.qk_rope_head_dim, " but ", ckpt.file_of(kv_a), ": tensor '", kv_a, "' has ", s[0],
                         " rows (DeepseekV3Config's defaults where a key is not given: kv_lora_rank 512, qk_rope_head_dim 64)"));
}

void mla_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  TensorShapes shapes;
  mla_tensors(c, prefix, shapes);
  const std::string p = prefix + "self_attn.";
  for (const auto& proj : mla_projections(c))
    for (const auto& [name, shape] : shapes)
      if (name == p + proj + ".weight") out.push_back(LoraSite{p + proj, proj, false, 1, shape[1], shape[0]});
}

void mla_calls(const HfConfig& c, const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
               std::vector<OpCall>& out) {
  for (const auto& proj : mla_projections(c))
    out.push_back({"linear.lora", ops::to_string(formats.at(prefix + "self_attn." + proj + ".weight")), ""});
  out.push_back({"rms_norm", "", ""});  // q_a_layernorm, kv_a_layernorm
  out.push_back({"attention", "", ""});  // qk head dim nope + rope, v head dim v_head_dim
}

at::Tensor DecoderModel::mla_block(int64_t i, const at::Tensor& x, const LayerInputs& in) {
  const at::Tensor &pos = in.pos, &cu = in.cu, &inv_freq = in.inv_freq;
  const int64_t max_len = in.max_len;
  const std::string p = str("model.layers.", i, ".self_attn.");
  MlaModules m;
  m.linear = [&](const at::Tensor& t, const std::string& module) { return linear(t, p + module); };
  m.norm = [&](const at::Tensor& t, const std::string& norm, double eps) { return rms_norm(t, p + norm + ".weight", {}, eps).first; };
  const MlaOptions o = mla_options(cfg_);
  const at::Tensor freqs = pos.to(at::kFloat).unsqueeze(-1) * inv_freq.unsqueeze(0);  // [T, rope/2]
  if (!decode_step_) {
    // Context parallelism: per-head k (the shared rope key is per token, so it splits as k does) and v through
    // the ring, as the other families' attention.
    ops::AttentionArgs a = mla_attention_args(o, m, x, freqs, cu, max_len);
    at::Tensor out = cp_split_ ? ring_attention(*cp_split_, a, attention_backend()) : autograd::attention(attention_backend(), std::move(a));
    return linear(out.reshape({x.size(0), o.num_heads * o.v_head_dim}), p + "o_proj");
  }
  // KV-cached decode: the cache holds each token's latent and rope key (as the model is served). A prefill runs the
  // op as training does; later steps attend the latent with kv_b_proj absorbed (mla_absorb_, the default: no
  // per-step expansion), or expand the rows' whole cached span through kv_b_proj (its LoRA included) as
  // transformers does.
  MlaLatent l = mla_latent(o, m, x, freqs);
  cache_store(i, l.kv.unsqueeze(1), l.k_rope.unsqueeze(1));
  ops::AttentionArgs a;
  a.q = l.q.contiguous();
  a.softmax_scale = o.scale();
  a.causal = true;
  at::Tensor out;
  if (decode_fresh()) {  // a prefill: the new tokens are all the keys
    auto [k, v] = mla_expand_kv(o, m, l.kv, l.k_rope);
    a.k = k.contiguous();
    a.v = v.contiguous();
    a.cu_seqlens = cu;
    a.max_seqlen = max_len;
    a.check_values = false;
    out = autograd::attention(attention_backend(), std::move(a));
  } else if (mla_absorb_) {  // kv_b_proj absorbed (mla.hpp): the queries attend the latent itself
    auto [kv, kr] = cached_rows(i);  // [S, L, 1, kv_lora_rank], [S, L, 1, rope]
    at::Tensor& kv_b = cached_mla_absorbed(i);
    if (!kv_b.defined()) kv_b = mla_absorbed_kv_b(o, m, x.options());
    a.q = mla_absorbed_query(o, l.q, kv_b);
    out = mla_absorbed_output(o, attend_cached(a, at::cat({kv, kr}, -1), kv), kv_b).to(x.scalar_type());
  } else {
    auto [kv, kr] = cached_rows(i);  // [S, L, 1, kv_lora_rank], [S, L, 1, rope]
    const int64_t S = kv.size(0), L = kv.size(1);
    auto [k, v] = mla_expand_kv(o, m, kv.reshape({S * L, o.kv_lora_rank}), kr.reshape({S * L, o.qk_rope_head_dim}));
    out = attend_cached(a, k.view({S, L, o.num_heads, o.qk_head_dim()}), v.view({S, L, o.num_heads, o.v_head_dim}));
  }
  return linear(out.reshape({x.size(0), o.num_heads * o.v_head_dim}), p + "o_proj");
}

namespace {
// Decode keeps each token's compressed latent (kv_lora_rank, after its norm) and the shared rope key (after RoPE),
// as the model is served: kv_lora_rank + rope numbers a token instead of heads x (qk + v).
MixerCache mla_cache(const HfConfig& c, int64_t batch, int64_t capacity) {
  return {{batch, capacity, 1, c.mla.kv_lora_rank}, {batch, capacity, 1, c.mla.qk_rope_head_dim}, {}, {}};
}
}  // namespace

const MixerPart& Parts::mla() {
  static const MixerPart p{{"mla", mla_tensors, mla_lora_sites, mla_calls}, &DecoderModel::mla_block, mla_cache};
  return p;
}

}  // namespace ax::models
