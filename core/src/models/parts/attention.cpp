// Multi-head attention as a decoder layer's mixer (every family's but deepseek_v3's and the linear-attention
// layers): q/k/v_proj (biases, q/k norms per head or over all heads, clip_qkv, Qwen3.5's output gate) → RoPE
// (full or partial, multimodal, yarn's attention factor) → the attention op (sliding windows, gpt_oss's sinks,
// gemma3's bidirectional image groups; decode: the KV cache; context parallelism: the ring) → o_proj.
#include <cmath>

#include <ATen/ATen.h>

#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "models/decoder_plan.hpp"
#include "models/layer_parts.hpp"
#include "models/ring_attention.hpp"

namespace ax::models {

namespace {

// q_proj's rows: Qwen3.5 / Qwen3-Next hold per head [q | output gate].
int64_t q_rows(const HfConfig& c) { return c.num_heads * c.head_dim * (c.attn_output_gate ? 2 : 1); }

void attention_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const std::string p = prefix + "self_attn.";
  out.push_back({p + "q_proj.weight", {q_rows(c), H}});
  out.push_back({p + "k_proj.weight", {Hkv * D, H}});
  out.push_back({p + "v_proj.weight", {Hkv * D, H}});
  out.push_back({p + "o_proj.weight", {H, Hq * D}});
  if (c.qkv_bias) {
    out.push_back({p + "q_proj.bias", {q_rows(c)}});
    out.push_back({p + "k_proj.bias", {Hkv * D}});
    out.push_back({p + "v_proj.bias", {Hkv * D}});
  }
  if (c.o_bias) out.push_back({p + "o_proj.bias", {H}});
  if (c.qk_norm) {
    out.push_back({p + "q_norm.weight", {D}});
    out.push_back({p + "k_norm.weight", {D}});
  }
  if (c.qk_norm_full) {
    out.push_back({p + "q_norm.weight", {Hq * D}});
    out.push_back({p + "k_norm.weight", {Hkv * D}});
  }
  if (c.attention_sinks) out.push_back({p + "sinks", {Hq}});
}

void attention_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const std::string p = prefix + "self_attn.";
  out.push_back(LoraSite{p + "q_proj", "q_proj", false, 1, H, q_rows(c)});
  out.push_back(LoraSite{p + "k_proj", "k_proj", false, 1, H, Hkv * D});
  out.push_back(LoraSite{p + "v_proj", "v_proj", false, 1, H, Hkv * D});
  out.push_back(LoraSite{p + "o_proj", "o_proj", false, 1, Hq * D, H});
}

void attention_calls(const HfConfig& c, const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out) {
  for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
    out.push_back({"linear.lora", ops::to_string(formats.at(prefix + "self_attn." + proj + ".weight")), ""});
  if (c.qk_norm) out.push_back({"norm_rope", "", ""});  // else plain RoPE in ATen
  if (c.qk_norm_full) out.push_back({"rms_norm", "", ""});
  out.push_back({"attention", "", attention_layout(c)});
}

// Decode keeps k and v after RoPE, [batch, capacity, Hkv, D] (token-major, the varlen layout).
MixerCache attention_cache(const HfConfig& c, int64_t batch, int64_t capacity) {
  return {{batch, capacity, c.num_kv_heads, c.head_dim}, {batch, capacity, c.num_kv_heads, c.head_dim}, {}, {}};
}

// Multimodal RoPE (Qwen2_5_VLRotaryEmbedding): angles of the [3, T] positions, frequency j of section s
// taken from axis s % 3 (temporal, height, width). [T, head_dim/2] fp32.
at::Tensor mrope_freqs(const at::Tensor& pos3, const at::Tensor& inv_freq, const std::vector<int64_t>& section) {
  at::Tensor f = pos3.to(at::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});  // [3, T, D/2]
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (std::size_t s = 0; s < section.size(); ++s) {
    parts.push_back(f[static_cast<int64_t>(s % 3)].narrow(-1, start, section[s]));
    start += section[s];
  }
  return at::cat(parts, -1);
}

}  // namespace

at::Tensor DecoderModel::attention_block(int64_t i, const at::Tensor& x, const LayerInputs& in) {
  const at::Tensor &pos = in.pos, &cu = in.cu, &inv_freq = in.inv_freq;
  const int64_t max_len = in.max_len;
  const std::string p = layer_prefix(i) + "self_attn.";
  const int64_t T = x.size(0), D = cfg_.head_dim, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads;
  at::Tensor q = linear(x, p + "q_proj");
  at::Tensor gate;  // Qwen3.5 / Qwen3-Next: q_proj holds per head [q | output gate]
  if (cfg_.attn_output_gate) {
    at::Tensor qg = q.view({T, Hq, 2 * D});
    gate = qg.narrow(-1, D, D).reshape({T, Hq * D});
    q = qg.narrow(-1, 0, D).reshape({T, Hq * D});
  }
  at::Tensor k = linear(x, p + "k_proj");
  at::Tensor v = linear(x, p + "v_proj");
  if (cfg_.qk_norm_full) {  // olmoe: one norm over all heads of q (of k), before the split into heads
    q = rms_norm(q, p + "q_norm.weight").first;
    k = rms_norm(k, p + "k_norm.weight").first;
  }
  if (cfg_.clip_qkv > 0) {
    q = q.clamp(-cfg_.clip_qkv, cfg_.clip_qkv);
    k = k.clamp(-cfg_.clip_qkv, cfg_.clip_qkv);
    v = v.clamp(-cfg_.clip_qkv, cfg_.clip_qkv);
  }
  q = q.view({T, Hq, D});
  k = k.view({T, Hkv, D});
  v = v.view({T, Hkv, D});
  // transformers multiplies cos and sin by the rope's attention factor (yarn). With RoPE on all of head_dim q·k
  // gains its square, folded into the softmax scale below; with partial RoPE only the rotated dims carry it, so
  // it scales cos and sin here.
  const double af = cfg_.rope_of(i).attention_factor;
  const bool partial = cfg_.rope_dim() < D;
  const double rope_factor = partial ? af : 1.0;
  if (cfg_.qk_norm && pos.dim() == 2) {
    // Multimodal RoPE after per-head q/k norms (qwen3_vl): the fused norm_rope op takes 1-D positions only,
    // so the norm runs alone and the rotation below takes the [3, T] positions.
    q = rms_norm(q, p + "q_norm.weight").first;
    k = rms_norm(k, p + "k_norm.weight").first;
  }
  if (cfg_.qk_norm && pos.dim() == 1) {
    auto op = kernels_->get<ops::NormRope>(ops::dtype_name(dtype_));
    auto nr = [&](const at::Tensor& t, const std::string& wname) {
      ops::NormRopeArgs a;
      a.x = t;
      a.weight = w(wname);
      a.eps = cfg_.rms_norm_eps;
      a.weight_offset = cfg_.norm_offset;
      a.position_ids = pos;
      a.inv_freq = inv_freq;
      a.attention_scaling = rope_factor;
      return autograd::norm_rope(op, std::move(a));
    };
    q = nr(q, p + "q_norm.weight");
    k = nr(k, p + "k_norm.weight");
  } else {
    // Plain RoPE (HF rotate-half): norm_rope is a norm+rope op, and these families have no q/k norm.
    at::Tensor freqs = pos.dim() == 2 ? mrope_freqs(pos, inv_freq, cfg_.mrope_section)
                                      : pos.to(at::kFloat).unsqueeze(-1) * inv_freq.unsqueeze(0);
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    at::Tensor cos = (emb.cos() * rope_factor).to(x.scalar_type()).unsqueeze(1);
    at::Tensor sin = (emb.sin() * rope_factor).to(x.scalar_type()).unsqueeze(1);
    // Partial RoPE (glm4_moe): the first R = rope_dim() dims rotate, the rest pass.
    const int64_t R = emb.size(-1);
    auto rot = [&](const at::Tensor& t) {
      at::Tensor r = t.narrow(-1, 0, R), t1 = r.narrow(-1, 0, R / 2), t2 = r.narrow(-1, R / 2, R / 2);
      r = r * cos + at::cat({-t2, t1}, -1) * sin;
      return R == D ? r : at::cat({r, t.narrow(-1, R, D - R)}, -1);
    };
    q = rot(q);
    k = rot(k);
  }
  ops::AttentionArgs a;
  a.q = q.contiguous();
  a.k = k.contiguous();
  a.v = v.contiguous();
  a.cu_seqlens = cu;
  a.max_seqlen = max_len;
  // The rope's attention factor squared (full RoPE: see above); gemma3_text scales by query_pre_attn_scalar^-0.5
  // instead of head_dim^-0.5.
  a.softmax_scale = (partial ? 1.0 : af * af) * (cfg_.attn_scale > 0 ? cfg_.attn_scale : 1.0 / std::sqrt(double(D)));
  a.causal = true;
  // transformers' sliding window W admits keys with q - W < k <= q: W - 1 to the left of the query.
  a.window_left = cfg_.window(i) > 0 ? cfg_.window(i) - 1 : -1;
  a.check_values = false;  // cu_seqlens were validated when the batch was built
  // gpt_oss: per-head sinks, fp32 as the op takes them; only backends claiming the "sinks" layout qualify.
  if (cfg_.attention_sinks) a.sinks = w(p + "sinks").to(at::kFloat);
  // gemma3's images; in decode, only a prefill sets them (the op runs then: decode_fresh).
  if (attention_groups_.defined()) a.groups = attention_groups_.to(at::kInt);
  // Context parallelism: this rank's queries over every rank's keys, K/V going around the ring.
  at::Tensor o = decode_step_ ? cached_attention(i, a)  // KV-cached decode
                 : cp_split_  ? ring_attention(*cp_split_, a, attention_backend())
                              : autograd::attention(attention_backend(), std::move(a));
  o = o.reshape({T, Hq * D});
  if (gate.defined()) o = o * at::sigmoid(gate);
  return linear(o, p + "o_proj");
}

std::shared_ptr<ops::Attention> attention_chain_of(KernelSet& kernels, at::ScalarType dtype, const std::string& layout) {
  std::vector<ops::NamedAttention> named;
  for (auto& [n, b] : kernels.get_all<ops::Attention>(ops::dtype_name(dtype), "", layout)) named.push_back({n, b});
  return ops::attention_chain(std::move(named));
}

std::shared_ptr<ops::Attention> DecoderModel::attention_backend() {
  if (!attention_chain_) attention_chain_ = attention_chain_of(*kernels_, dtype_, attention_layout(cfg_));
  return attention_chain_;
}

const MixerPart& Parts::attention() {
  static const MixerPart p{{"attention", attention_tensors, attention_lora_sites, attention_calls},
                           &DecoderModel::attention_block,
                           attention_cache};
  return p;
}

}  // namespace ax::models
