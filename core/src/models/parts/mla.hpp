// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): transformers' DeepseekV3Attention on packed rows.
//
//   q      = q_b_proj(q_a_layernorm(q_a_proj(x)))    or q_proj(x) when q_lora_rank is null   [T, Hq, nope + rope]
//   kv, kr = split(kv_a_proj_with_mqa(x), [kv_lora_rank, rope])    kv = kv_a_layernorm(kv)   (the latent)
//   RoPE on the last `rope` dims of q and on kr only (one rope key shared by every head); interleaved pairs
//   (x0, x1), (x2, x3), ... when rope_interleave, written back de-interleaved as transformers does (the same
//   permutation on q and k, so the scores are those of the interleaved rotation), else rotate-half
//   k_nope, v = split(kv_b_proj(kv), [nope, v]) per head          k = [k_nope, kr]       [T, Hq, nope + rope]
//   out    = o_proj(attention(q, k, v))    qk head dim nope + rope, v head dim v_head_dim (the op takes Dv != D)
//
// The latent (kv, kr) is what a KV cache of this layer holds; mla_expand_kv turns it into k and v.
// Two details of transformers that differ from the decoder's other attention: the latent RMSNorms use
// DeepseekV3RMSNorm's own eps 1e-6 (not rms_norm_eps), and YaRN's cos/sin factor scales the rope dims
// only (so it cannot be folded into the softmax scale); the softmax scale is (nope + rope)^-1/2 times
// mscale(factor, mscale_all_dim)^2 under a non-default RoPE with mscale_all_dim set.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include "axengine/ops/attention.hpp"

namespace ax::models {

struct MlaOptions {
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: q_proj (the config's null)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;
  double rope_attention_factor = 1.0;  // what transformers multiplies cos and sin by (YaRN)
  double softmax_scale = 0.0;          // 0: (nope + rope)^-1/2
  double latent_norm_eps = 1e-6;       // q_a_layernorm, kv_a_layernorm
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  double scale() const { return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(qk_head_dim())); }
};

// The softmax scale transformers' DeepseekV3Attention uses: (nope + rope)^-1/2, times
// (0.1·mscale_all_dim·ln(factor) + 1)^2 when the RoPE is not the default one, mscale_all_dim is set and
// factor > 1 (yarn_apply_mscale).
// (Inline: the config reader computes it, without the part's tensor code.)
inline double mla_softmax_scale(int64_t qk_head_dim, bool default_rope, double factor, double mscale_all_dim) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  if (!default_rope && mscale_all_dim != 0 && factor > 1) {
    const double m = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

// What the layer hands the part, by the checkpoint's module names under self_attn.: its projections
// (LoRA included) and its RMSNorms ("q_a_layernorm", "kv_a_layernorm", with the eps to use).
struct MlaModules {
  std::function<at::Tensor(const at::Tensor& x, const std::string& module)> linear;
  std::function<at::Tensor(const at::Tensor& x, const std::string& norm, double eps)> norm;
};

struct MlaLatent {
  at::Tensor q;       // [T, Hq, nope + rope], the rope dims rotated
  at::Tensor kv;      // [T, kv_lora_rank], normed: the cached latent
  at::Tensor k_rope;  // [T, rope], rotated: the cached shared rope key
};

// freqs: fp32 [T, rope/2], each row's positions times the inverse frequencies.
MlaLatent mla_latent(const MlaOptions& o, const MlaModules& m, const at::Tensor& x, const at::Tensor& freqs);
// k [T, Hq, nope + rope] and v [T, Hq, v_head_dim] of the latent (T rows of it).
std::pair<at::Tensor, at::Tensor> mla_expand_kv(const MlaOptions& o, const MlaModules& m, const at::Tensor& kv,
                                                const at::Tensor& k_rope);
// Decode with kv_b_proj absorbed (DeepSeek-V2's inference form): with W_UK, W_UV kv_b_proj's per-head rows for
// k_nope and v, q_nope·k_nope = (q_nope·W_UK)·latent and probs·v = (probs·latent)·W_UVᵀ, so the queries attend the
// cached latent and rope key directly (one key head of kv_lora_rank + rope shared by every query head) and nothing
// is expanded per step: O(length·(kv_lora_rank + rope)) per head instead of kv_b_proj over the whole span.
// kv_b_proj as [Hq, nope + v, kv_lora_rank] fp32: the projection of the identity, so its LoRA, packing or unfrozen
// weight are what the forward uses (made once per decode cache).
at::Tensor mla_absorbed_kv_b(const MlaOptions& o, const MlaModules& m, const at::TensorOptions& opts);
// The query over the latent [T, Hq, kv_lora_rank + rope] fp32: [q_nope·W_UK, q_rope] (q: mla_latent's).
at::Tensor mla_absorbed_query(const MlaOptions& o, const at::Tensor& q, const at::Tensor& kv_b);
// The attention output over the latent [T, Hq, kv_lora_rank] through W_UV: [T, Hq, v_head_dim] fp32.
at::Tensor mla_absorbed_output(const MlaOptions& o, const at::Tensor& out_latent, const at::Tensor& kv_b);
// The attention op's arguments of the mixer on packed rows (q, and k, v expanded from the latent; scale, causal).
ops::AttentionArgs mla_attention_args(const MlaOptions& o, const MlaModules& m, const at::Tensor& x, const at::Tensor& freqs,
                                      const at::Tensor& cu_seqlens, int64_t max_seqlen);
// The whole mixer on packed rows: [T, hidden] -> [T, hidden] (o_proj applied).
at::Tensor mla_attention(const MlaOptions& o, const MlaModules& m, const at::Tensor& x, const at::Tensor& freqs,
                         const at::Tensor& cu_seqlens, int64_t max_seqlen, const std::shared_ptr<ops::Attention>& op);

}  // namespace ax::models
