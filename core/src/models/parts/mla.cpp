// Multi-head latent attention: see mla.hpp.
#include "models/parts/mla.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "models/autograd_ops.hpp"

namespace ax::models {
namespace {

// transformers' RoPE on t [T, h, R] with cos/sin [T, 1, R/2] (the per-pair angles, attention factor in).
at::Tensor mla_rotate(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin, bool interleave) {
  const int64_t R = t.size(-1);
  // Interleaved pairs (t[2i], t[2i+1]); rotate-half pairs (t[i], t[i + R/2]). Either way the result holds
  // the pairs' first members rotated, then their second members (apply_rotary_pos_emb_interleave's cat).
  at::Tensor t1 = interleave ? t.slice(-1, 0, R, 2) : t.narrow(-1, 0, R / 2);
  at::Tensor t2 = interleave ? t.slice(-1, 1, R, 2) : t.narrow(-1, R / 2, R / 2);
  return at::cat({t1 * cos - t2 * sin, t2 * cos + t1 * sin}, -1);
}

}  // namespace

MlaLatent mla_latent(const MlaOptions& o, const MlaModules& m, const at::Tensor& x, const at::Tensor& freqs) {
  const int64_t T = x.size(0), H = o.num_heads, nope = o.qk_nope_head_dim, R = o.qk_rope_head_dim;
  at::Tensor q = o.q_lora_rank > 0 ? m.linear(m.norm(m.linear(x, "q_a_proj"), "q_a_layernorm", o.latent_norm_eps), "q_b_proj")
                                   : m.linear(x, "q_proj");
  q = q.view({T, H, nope + R});
  at::Tensor ckv = m.linear(x, "kv_a_proj_with_mqa");  // [T, kv_lora_rank + R]
  MlaLatent l;
  l.kv = m.norm(ckv.narrow(-1, 0, o.kv_lora_rank), "kv_a_layernorm", o.latent_norm_eps);
  // cos and sin as transformers hands them to the rotation: fp32 angles, scaled, cast to the activations'
  // dtype (rotate-half's cat(freqs, freqs) halves are the same numbers).
  at::Tensor cos = (freqs.cos() * o.rope_attention_factor).to(x.scalar_type()).unsqueeze(1);
  at::Tensor sin = (freqs.sin() * o.rope_attention_factor).to(x.scalar_type()).unsqueeze(1);
  at::Tensor k_rope = mla_rotate(ckv.narrow(-1, o.kv_lora_rank, R).unsqueeze(1), cos, sin, o.rope_interleave);
  l.k_rope = k_rope.squeeze(1);
  l.q = at::cat({q.narrow(-1, 0, nope), mla_rotate(q.narrow(-1, nope, R), cos, sin, o.rope_interleave)}, -1);
  return l;
}

std::pair<at::Tensor, at::Tensor> mla_expand_kv(const MlaOptions& o, const MlaModules& m, const at::Tensor& kv,
                                                const at::Tensor& k_rope) {
  const int64_t T = kv.size(0), H = o.num_heads, nope = o.qk_nope_head_dim, R = o.qk_rope_head_dim;
  at::Tensor kvb = m.linear(kv, "kv_b_proj").view({T, H, nope + o.v_head_dim});
  at::Tensor k = at::cat({kvb.narrow(-1, 0, nope), k_rope.unsqueeze(1).expand({T, H, R})}, -1);
  return {k, kvb.narrow(-1, nope, o.v_head_dim)};
}

at::Tensor mla_absorbed_kv_b(const MlaOptions& o, const MlaModules& m, const at::TensorOptions& opts) {
  const at::Tensor w = m.linear(at::eye(o.kv_lora_rank, opts), "kv_b_proj");  // [kv_lora_rank, Hq·(nope + v)]: Wᵀ
  return w.to(at::kFloat).t().reshape({o.num_heads, o.qk_nope_head_dim + o.v_head_dim, o.kv_lora_rank}).contiguous();
}

at::Tensor mla_absorbed_query(const MlaOptions& o, const at::Tensor& q, const at::Tensor& kv_b) {
  const int64_t nope = o.qk_nope_head_dim;
  // [T, Hq, nope] x [Hq, nope, C] per head -> [T, Hq, C]
  at::Tensor q_lat = at::matmul(q.narrow(-1, 0, nope).to(at::kFloat).transpose(0, 1), kv_b.narrow(1, 0, nope)).transpose(0, 1);
  return at::cat({q_lat, q.narrow(-1, nope, o.qk_rope_head_dim).to(at::kFloat)}, -1).contiguous();
}

at::Tensor mla_absorbed_output(const MlaOptions& o, const at::Tensor& out_latent, const at::Tensor& kv_b) {
  // [Hq, T, C] x [Hq, C, v] -> [T, Hq, v]
  const at::Tensor w_uv = kv_b.narrow(1, o.qk_nope_head_dim, o.v_head_dim);  // [Hq, v, C]
  return at::matmul(out_latent.to(at::kFloat).transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1);
}

ops::AttentionArgs mla_attention_args(const MlaOptions& o, const MlaModules& m, const at::Tensor& x, const at::Tensor& freqs,
                                      const at::Tensor& cu_seqlens, int64_t max_seqlen) {
  MlaLatent l = mla_latent(o, m, x, freqs);
  auto [k, v] = mla_expand_kv(o, m, l.kv, l.k_rope);
  ops::AttentionArgs a;
  a.q = l.q.contiguous();
  a.k = k.contiguous();
  a.v = v.contiguous();
  a.cu_seqlens = cu_seqlens;
  a.max_seqlen = max_seqlen;
  a.softmax_scale = o.scale();
  a.causal = true;
  a.check_values = false;  // cu_seqlens were validated when the batch was built
  return a;
}

at::Tensor mla_attention(const MlaOptions& o, const MlaModules& m, const at::Tensor& x, const at::Tensor& freqs,
                         const at::Tensor& cu_seqlens, int64_t max_seqlen, const std::shared_ptr<ops::Attention>& op) {
  at::Tensor out = autograd::attention(op, mla_attention_args(o, m, x, freqs, cu_seqlens, max_seqlen));  // [T, Hq, v_head_dim]
  return m.linear(out.reshape({x.size(0), o.num_heads * o.v_head_dim}), "o_proj");
}

}  // namespace ax::models
