// DecoderModel's KV-cached incremental forward (axengine/decode.hpp). Linear-attention (Gated DeltaNet) layers
// keep no keys: each row's conv window and recurrent state, which gated_deltanet_block reads as the ops'
// initial states of the step's segments and writes back from their final states (O(1) per token); what each
// layer keeps is its mixer part's (MixerCache, models/layer_parts.hpp). decode runs the training forward's own
// layers (embedding, norms, projections with LoRA, RoPE, MoE blocks) over just the new tokens; only attention
// differs, and attention_block hands it to cached_attention while decode_step_ is set:
//   - the new tokens' k/v (after RoPE / q-k norm) are written into the cache at their rows' positions;
//   - when every row started empty (a prefill), the queries and keys are the same tokens and the `attention`
//     op runs exactly as in training (varlen, causal, equal q/k lengths);
//   - otherwise (decoding one token, or appending a turn to a conversation) the queries are fewer than the
//     keys, outside the op's contract, and the reference math runs here in ATen: fp32 scores scale·q·kᵀ
//     (the scale carries yarn's attention factor, as the op's softmax_scale does), causal and sliding-window
//     masks by absolute position, softmax, ·v, GQA by grouping query heads over their KV head.
#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "ops/check.hpp"

namespace ax::models {

namespace {

// Per layer k and v, [batch, capacity, Hkv, D] (token-major, the varlen layout; MLA layers: the latent
// [.., 1, kv_lora_rank] and the rope key [.., 1, rope]), and each row's length.
class DecoderKvCache final : public KvCache {
 public:
  DecoderKvCache(const DecoderModel* owner, int64_t batch, int64_t capacity) : owner(owner), cap(capacity), len(batch, 0) {}
  int64_t batch() const override { return static_cast<int64_t>(len.size()); }
  int64_t capacity() const override { return cap; }
  int64_t length(int64_t row) const override { return len.at(static_cast<std::size_t>(row)); }
  void truncate(int64_t row, int64_t length) override {
    if (row < 0 || row >= batch()) throw UsageError(str("KV cache: row ", row, " out of [0, ", batch(), ")"));
    if (length < 0 || length > len[row])
      throw UsageError(str("KV cache: cannot truncate row ", row, " of ", len[row], " tokens to ", length));
    // A linear-attention layer's state sums up every token of the row: it can start over, not go back.
    if (!state.empty() && length != 0 && length != len[row])
      throw UsageError(str("KV cache: cannot truncate row ", row, " of ", len[row], " tokens to ", length,
                           ": the model's linear-attention layers keep a recurrent state of the whole row, which can "
                           "only be emptied (truncate to 0)"));
    if (length == 0)
      for (std::size_t l = 0; l < state.size(); ++l)
        if (state[l].defined()) {
          state[l][row].zero_();
          conv[l][row].zero_();
        }
    len[row] = length;  // what lies beyond is overwritten by the next tokens and never attended before
  }

  const DecoderModel* owner;
  int64_t cap;
  std::vector<int64_t> len;
  std::vector<at::Tensor> k, v;  // attention layers (undefined for linear-attention ones)
  std::vector<at::Tensor> mla_absorbed;  // MLA layers: kv_b_proj's absorbed form (parts/mla_layer.cpp), made once
  // Linear-attention layers (undefined for attention ones; both empty when the model has none): each row's
  // conv window [batch, W-1, C] (the last W-1 inputs) and recurrent state [batch, Hv, Dk, Dv] fp32. O(1) per token.
  std::vector<at::Tensor> conv, state;
};

}  // namespace

// One decode call's layout: the new tokens packed segment by segment (one segment per row given tokens).
struct DecodeStep {
  DecoderKvCache* cache = nullptr;
  std::vector<int64_t> rows, start, count;  // per segment: cache row, its length before, tokens added
  int64_t keys = 0;                         // longest row after the step: the key span attention reads
  bool fresh = false;                       // every segment's row started empty
  at::Tensor rows_dev;                      // rows on the device
  at::Tensor dest;                          // each token's slot in a [segments · max count] padded layout
  at::Tensor qpos;                          // [segments, max count]: each query's absolute position
  at::Tensor kpos;                          // [keys]: 0, 1, ...
};

std::unique_ptr<KvCache> DecoderModel::new_cache(int64_t batch, int64_t capacity) {
  if (batch < 1 || capacity < 1) throw UsageError(str("KV cache: batch ", batch, " and capacity ", capacity, " must be >= 1"));
  auto c = std::make_unique<DecoderKvCache>(this, batch, capacity);
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  // Each layer's mixer says what it keeps (MixerCache): k/v entries, or a conv window and a recurrent state.
  std::vector<MixerCache> kept;
  bool any_state = false;
  for (const LayerParts& l : layers_) {
    kept.push_back(l.mixer->cache(cfg_, batch, capacity));
    any_state = any_state || !kept.back().state.empty();
  }
  auto zeros = [&](const std::vector<int64_t>& shape, at::ScalarType dtype) {
    return shape.empty() ? at::Tensor() : at::zeros(shape, opts.dtype(dtype));
  };
  for (const MixerCache& m : kept) {
    c->k.push_back(zeros(m.k, dtype_));
    c->v.push_back(zeros(m.v, dtype_));
    if (!any_state) continue;  // both empty when no layer keeps a state (DecoderKvCache::truncate reads that)
    c->conv.push_back(zeros(m.conv, dtype_));
    c->state.push_back(zeros(m.state, at::kFloat));
  }
  return c;
}

std::pair<at::Tensor, at::Tensor> DecoderModel::cached_linear_state(int64_t layer) const {
  const DecodeStep& s = *decode_step_;
  return {s.cache->conv[layer].index_select(0, s.rows_dev), s.cache->state[layer].index_select(0, s.rows_dev)};
}

void DecoderModel::store_linear_state(int64_t layer, const at::Tensor& conv, const at::Tensor& state) {
  DecodeStep& s = *decode_step_;
  s.cache->conv[layer].index_copy_(0, s.rows_dev, conv);
  s.cache->state[layer].index_copy_(0, s.rows_dev, state);
}

void DecoderModel::cache_store(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  DecodeStep& s = *decode_step_;
  DecoderKvCache& c = *s.cache;
  int64_t off = 0;
  for (std::size_t g = 0; g < s.rows.size(); ++g) {
    c.k[layer][s.rows[g]].narrow(0, s.start[g], s.count[g]).copy_(k.narrow(0, off, s.count[g]));
    c.v[layer][s.rows[g]].narrow(0, s.start[g], s.count[g]).copy_(v.narrow(0, off, s.count[g]));
    off += s.count[g];
  }
}

bool DecoderModel::decode_fresh() const { return decode_step_->fresh; }

at::Tensor& DecoderModel::cached_mla_absorbed(int64_t layer) {
  auto& slots = decode_step_->cache->mla_absorbed;
  if (slots.empty()) slots.resize(static_cast<std::size_t>(cfg_.num_layers));
  return slots.at(static_cast<std::size_t>(layer));
}

std::pair<at::Tensor, at::Tensor> DecoderModel::cached_rows(int64_t layer) const {
  const DecodeStep& s = *decode_step_;
  return {s.cache->k[layer].index_select(0, s.rows_dev).narrow(1, 0, s.keys),
          s.cache->v[layer].index_select(0, s.rows_dev).narrow(1, 0, s.keys)};
}

at::Tensor DecoderModel::cached_attention(int64_t layer, const ops::AttentionArgs& a) {
  cache_store(layer, a.k, a.v);
  if (decode_step_->fresh) return autograd::attention(attention_backend(), a);
  auto [k, v] = cached_rows(layer);
  return attend_cached(a, k, v);
}

at::Tensor DecoderModel::attend_cached(const ops::AttentionArgs& a, const at::Tensor& keys, const at::Tensor& values) {
  const DecodeStep& s = *decode_step_;
  const int64_t n_seg = static_cast<int64_t>(s.rows.size());
  const int64_t T = a.q.size(0), Hq = a.q.size(1), D = a.q.size(2), Hkv = keys.size(2), G = Hq / Hkv;
  const int64_t C = s.qpos.size(1), L = s.keys;
  const auto ct = a.q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Queries padded to [segments, C, Hq, D], then grouped [segments, Hkv, G·C, D] (query heads of a KV head
  // side by side, as transformers' repeat_kv pairs them).
  at::Tensor q = at::zeros({n_seg * C, Hq, D}, a.q.options().dtype(ct)).index_copy_(0, s.dest, a.q.to(ct));
  q = q.view({n_seg, C, Hq, D}).permute({0, 2, 1, 3}).reshape({n_seg, Hkv, G * C, D});
  at::Tensor k = keys.to(ct).permute({0, 2, 1, 3});  // [S, Hkv, L, D]
  at::Tensor v = values.to(ct).permute({0, 2, 1, 3});
  const double scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(D));
  at::Tensor scores = (at::matmul(q, k.transpose(2, 3)) * scale).view({n_seg, Hkv, G, C, L});
  // Key j is hidden from the query at absolute position p when j > p (causal) or j < p - window_left (the
  // op's sliding window, which attention_block set from transformers' W: p - W < j <= p). Rows of a segment
  // beyond its count are padding: they see keys too (no all-masked row, no NaN) and are dropped below.
  at::Tensor kp = s.kpos.view({1, 1, L}), qp = s.qpos.unsqueeze(2);
  at::Tensor hidden = a.causal ? kp > qp : at::zeros({n_seg, C, L}, s.kpos.options().dtype(at::kBool));
  if (a.window_left >= 0) hidden = hidden | (kp < qp - a.window_left);
  scores = scores.masked_fill(hidden.view({n_seg, 1, 1, C, L}), -std::numeric_limits<double>::infinity());
  at::Tensor probs;
  if (a.sinks.defined()) {
    // gpt_oss: each head's sink logit joins every row's softmax as one more key with no value, then is dropped
    // (the attention op's `sinks`, docs/ops/attention.md). Query head h = kv·G + g, as the grouping above.
    at::Tensor sink = a.sinks.to(ct).view({1, Hkv, G, 1, 1}).expand({n_seg, Hkv, G, C, 1});
    probs = at::softmax(at::cat({scores, sink}, -1), -1).narrow(-1, 0, L).reshape({n_seg, Hkv, G * C, L});
  } else {
    probs = at::softmax(scores, -1).view({n_seg, Hkv, G * C, L});
  }
  at::Tensor o = at::matmul(probs, v).view({n_seg, Hq, C, v.size(3)}).permute({0, 2, 1, 3}).reshape({n_seg * C, Hq, v.size(3)});
  return o.index_select(0, s.dest).to(a.q.scalar_type()).view({T, Hq, v.size(3)});
}

at::Tensor DecoderModel::decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& kv) { return decode(tokens, kv, DecodeInputs{}); }

at::Tensor DecoderModel::decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& kv, const DecodeInputs& in) {
  auto* cache = dynamic_cast<DecoderKvCache*>(&kv);
  if (!cache || cache->owner != this) throw UsageError("decode: the KV cache was not made by this model (new_cache)");
  if (static_cast<int64_t>(tokens.size()) != cache->batch())
    throw UsageError(str("decode: ", tokens.size(), " rows of tokens for a cache of ", cache->batch()));
  const int64_t B = cache->batch(), V = cfg_.vocab_size;
  // Dynamic RoPE's frequencies follow the longest position of the forward (transformers recomputes them per
  // call from max(position_ids) + 1): one row at a time, so that each row gets its own, as it would alone.
  const bool given_inputs = in.embeds.defined() || in.rope_pos.defined() || in.attention_groups.defined() || in.after_layer;
  if (cfg_.rope.type == "dynamic") {
    if (given_inputs) throw UsageError("decode: given embeddings or positions with dynamic RoPE (no family has both)");
    int64_t given = 0;
    for (const auto& t : tokens) given += !t.empty();
    if (given > 1) {
      at::Tensor out = at::zeros({B, V}, at::kFloat);
      for (int64_t r = 0; r < B; ++r) {
        if (tokens[r].empty()) continue;
        std::vector<std::vector<int64_t>> one(static_cast<std::size_t>(B));
        one[r] = tokens[r];
        out[r].copy_(decode(one, kv)[r]);
      }
      return out;
    }
  }

  DecodeStep step;
  step.cache = cache;
  std::vector<int64_t> ids, pos;
  std::vector<int32_t> cu{0};
  int64_t C = 0;
  for (int64_t r = 0; r < B; ++r) {
    const auto& t = tokens[r];
    if (t.empty()) continue;
    const int64_t n = static_cast<int64_t>(t.size()), start = cache->len[r];
    if (start + n > cache->cap)
      throw UsageError(str("decode: row ", r, " would hold ", start + n, " tokens, over the cache's capacity ", cache->cap));
    for (int64_t j = 0; j < n; ++j) {
      if (t[j] < 0 || t[j] >= V) throw UsageError(str("decode: token id ", t[j], " out of [0, ", V, ")"));
      ids.push_back(t[j]);
      pos.push_back(start + j);
    }
    step.rows.push_back(r);
    step.start.push_back(start);
    step.count.push_back(n);
    step.keys = std::max(step.keys, start + n);
    C = std::max(C, n);
    cu.push_back(static_cast<int32_t>(ids.size()));
  }
  at::Tensor out = at::zeros({B, V}, at::kFloat);
  if (ids.empty()) return out;
  const int64_t n_seg = static_cast<int64_t>(step.rows.size());
  step.fresh = std::all_of(step.start.begin(), step.start.end(), [](int64_t s) { return s == 0; });
  const int64_t T = static_cast<int64_t>(ids.size());
  if (in.embeds.defined() && (in.embeds.dim() != 2 || in.embeds.size(0) != T || in.embeds.size(1) != cfg_.hidden_size))
    throw UsageError(str("decode: embeddings of shape ", ops::check::shape_str(in.embeds.sizes()), " for ", T, " tokens of hidden size ", cfg_.hidden_size));
  if (in.rope_pos.defined() && (in.rope_pos.dim() != 2 || in.rope_pos.size(0) != 3 || in.rope_pos.size(1) != T || cfg_.mrope_section.empty()))
    throw UsageError(str("decode: multimodal RoPE positions must be [3, ", T, "], for a config with mrope_section"));
  if (in.attention_groups.defined() && (in.attention_groups.dim() != 1 || in.attention_groups.size(0) != T))
    throw UsageError(str("decode: attention groups must be [", T, "]"));
  // The groups are the attention op's: a step that appends to rows already holding tokens runs the cached
  // reference math, which has none (images come in a row's first step, its prefill).
  if (in.attention_groups.defined() && !step.fresh)
    throw UsageError("decode: bidirectional attention groups (images) need a prefill: every row given tokens must start empty");

  // The padded query layout: token j of segment g sits at g·C + j.
  std::vector<int64_t> dest;
  for (int64_t g = 0; g < n_seg; ++g)
    for (int64_t j = 0; j < step.count[g]; ++j) dest.push_back(g * C + j);
  const auto dev_long = at::TensorOptions().dtype(at::kLong).device(device_);
  step.dest = at::tensor(dest, at::kLong).to(device_);
  step.rows_dev = at::tensor(step.rows, at::kLong).to(device_);
  step.qpos = at::tensor(step.start, at::kLong).to(device_).unsqueeze(1) + at::arange(C, dev_long).unsqueeze(0);
  step.kpos = at::arange(step.keys, dev_long);

  at::NoGradGuard no_grad;
  struct Restore {  // decode_step_, training_ and the attention groups go back as they were, however the forward ends
    DecoderModel* m;
    bool training;
    DecodeStep*& slot;
    at::Tensor& groups;
    ~Restore() {
      slot = nullptr;
      groups = at::Tensor();
      m->set_training(training);
    }
  } restore{this, training_, decode_step_, attention_groups_};
  training_ = false;  // no LoRA dropout
  decode_step_ = &step;
  attention_groups_ = in.attention_groups.defined() ? in.attention_groups.to(device_, at::kInt) : at::Tensor();

  at::Tensor ids_t = at::tensor(ids, at::kLong).to(device_);
  at::Tensor pos_t = in.rope_pos.defined() ? in.rope_pos.to(device_, at::kLong) : at::tensor(pos, at::kLong).to(device_);
  at::Tensor cu_t = at::tensor(cu, at::kInt).to(device_);
  at::Tensor inv_freq = inv_freq_;
  if (cfg_.rope.type == "dynamic" && step.keys > cfg_.rope.max_position) inv_freq = rope_inv_freq(cfg_, step.keys).to(device_);
  cast_lora_factors();
  at::Tensor h = in.embeds.defined() ? in.embeds.to(device_, dtype_) : embed(ids_t);
  std::vector<at::Tensor> router_logits;  // the aux loss is training's; decode drops them
  const LayerInputs in_layers{pos_t, cu_t, C, inv_freq};
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    h = layer(i, h, in_layers, router_logits);
    if (in.after_layer) h = in.after_layer(i, h);
    router_logits.clear();
  }
  h = rms_norm(h, "model.norm.weight").first;
  at::Tensor last = (cu_t.narrow(0, 1, n_seg).to(at::kLong) - 1);
  at::Tensor logits = linear(h.index_select(0, last), "lm_head").to(at::kFloat).to(at::kCPU);  // [S, V]
  out.index_copy_(0, at::tensor(step.rows, at::kLong), logits);
  for (int64_t g = 0; g < n_seg; ++g) cache->len[step.rows[g]] = step.start[g] + step.count[g];
  return out;
}

}  // namespace ax::models
