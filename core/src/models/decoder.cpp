// DecoderModel (decoder.hpp): its weights as the forward reads them (projections through linear.lora with their
// LoRA, norms through rms_norm), the forward over the assembled layers (decoder_layer.cpp) with the loss, and
// its parameters and LoRA sites. The load is decoder_load.cpp, the parts are models/layer_parts.hpp's.
#include "models/decoder.hpp"

#include <optional>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder_plan.hpp"
#include "models/recompute.hpp"
#include "models/ring_attention.hpp"

namespace ax::models {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}

// The causal-LM targets [B, S]: labels shifted left by one, -100 at the end of each row and where the next
// token starts a packed sample (position 0). Four kernels, no host sync. (Building them once per batch on the
// host would need a Batch field: a plugin ABI major bump, not worth these launches.)
at::Tensor next_token_targets(const at::Tensor& labels, const at::Tensor& position_ids) {
  const int64_t B = labels.size(0), S = labels.size(1);
  at::Tensor tgt = at::full({B, S}, -100, labels.options());
  if (S < 2) return tgt;
  at::Tensor head = tgt.narrow(1, 0, S - 1);
  head.copy_(labels.narrow(1, 1, S - 1));
  head.masked_fill_(position_ids.narrow(1, 1, S - 1).eq(0), -100);
  return tgt;
}


}  // namespace

at::Tensor DecoderModel::w(const std::string& name) const {
  if (!unfrozen_.empty())
    if (at::Tensor t = trained(name); t.defined()) return t;
  auto it = weights_.find(name);
  if (it == weights_.end()) throw RuntimeError(str("model has no weight '", name, "'"));
  return it->second;
}

const ops::WeightTensor& DecoderModel::projection(const std::string& name) const {
  auto it = frozen_.find(name);
  if (it == frozen_.end()) throw RuntimeError(str("model has no projection '", name, "'"));
  return it->second;
}

std::pair<at::Tensor, at::Tensor> DecoderModel::rms_norm(const at::Tensor& x, const std::string& weight,
                                                         const at::Tensor& residual, double eps) const {
  // transformers' RMSNorm (statistics in fp32, scale applied after casting back), with the residual add
  // before it fused in: the op's contract (docs/ops/rms_norm.md) has exactly these rounding points.
  ops::RmsNormArgs a;
  a.x = x;
  a.residual = residual;
  a.weight = w(weight);
  a.eps = eps > 0 ? eps : cfg_.rms_norm_eps;
  a.weight_offset = cfg_.norm_offset;
  auto r = autograd::rms_norm(kernels_->get<ops::RmsNorm>(ops::dtype_name(dtype_)), std::move(a));
  return {r.y, r.sum};
}

at::Tensor DecoderModel::fused_loss(const at::Tensor& h, const at::Tensor& targets, const at::Tensor& total) {
  const ops::WeightTensor& head = projection("lm_head.weight");
  if (!fused_loss_applies(head.format, lora_.find("lm_head") != nullptr, weights_.count("lm_head.bias") != 0)) return {};
  if (!unfrozen_.empty() && trained("lm_head.weight").defined()) return {};  // linear_ce computes no weight gradient
  ops::LinearCeArgs a;
  a.h = h;
  a.weight = head.values;
  a.targets = targets;
  a.ignore_index = -100;
  a.check_values = false;  // no host range check (a sync): a label out of range fails in the op's gather, as
                           // it did in cross_entropy
  at::Tensor per_token = autograd::linear_ce(kernels_->get<ops::LinearCe>(ops::dtype_name(dtype_)), std::move(a));
  // HF's mean over non-ignored targets; the count is clamped so that a batch without targets divides 0 by 1
  // (finite gradients) instead of 0 by 0. No host sync: the count stays on the device.
  at::Tensor count = total.defined() ? total : targets.ne(-100).sum().to(at::kFloat);
  return per_token.sum() / count.clamp_min(1.0);
}

at::Tensor DecoderModel::linear(const at::Tensor& x, const std::string& module) {
  if (!unfrozen_.empty())
    if (at::Tensor y = unfrozen_linear(x, module); y.defined()) return y;
  ops::LinearLoraArgs args;
  args.x = x;
  args.weight = projection(module + ".weight");
  auto bias = weights_.find(module + ".bias");
  if (bias != weights_.end()) args.bias = bias->second;
  auto op = kernels_->get<ops::LinearLora>(ops::dtype_name(dtype_), ops::to_string(args.weight.format));
  const LoraModule* m = lora_.find(module);
  if (!m) return autograd::linear_lora(op, std::move(args));
  const double p = lora_.spec.dropout;
  if (training_ && p > 0) {
    // Dropout acts on the LoRA branch's input only, so the op computes the base and the branch is plain ATen.
    at::Tensor base = autograd::linear_lora(op, std::move(args));
    at::Tensor xd = at::dropout(x.to(m->a.scalar_type()), p, true);
    return base + (at::matmul(at::matmul(xd, m->a.t()), m->b.t()) * m->scaling).to(base.scalar_type());
  }
  std::tie(args.lora_a, args.lora_b) = lora_factors(*m);
  args.scaling = m->scaling;
  return autograd::linear_lora(op, std::move(args));
}

std::pair<at::Tensor, at::Tensor> DecoderModel::lora_factors(const LoraModule& m) const {
  auto it = lora_cast_.find(&m);
  if (it != lora_cast_.end()) return it->second;
  return {m.a.to(dtype_), m.b.to(dtype_)};
}

// fp32 LoRA factors (lora.dtype = "fp32", peft's default) are cast to the compute dtype every forward. Cast
// one by one that is a copy kernel per factor forward and another backward (~190 launches a step on the bench
// MoE model); here all factors are concatenated (one kernel), cast (one) and split back into views, and the
// backward is one concatenation of their gradients, one cast and views again (the split's backward). The
// values are the same casts, bit for bit. Not used under activation checkpointing: a recomputed layer must
// reach its parameters through its own graph, not through nodes of the outer one.
void DecoderModel::cast_lora_factors() {
  lora_cast_.clear();
  if (lora_.modules.empty() || lora_.modules.front().a.scalar_type() == dtype_) return;
  std::vector<at::Tensor> flat;
  std::vector<int64_t> sizes;
  for (const auto& m : lora_.modules)
    for (const at::Tensor* t : {&m.a, &m.b}) {
      if (t->scalar_type() != lora_.modules.front().a.scalar_type()) return;  // mixed: per-module casts
      flat.push_back(t->reshape({-1}));
      sizes.push_back(t->numel());
    }
  std::vector<at::Tensor> parts = at::split_with_sizes(at::cat(flat).to(dtype_), sizes);
  std::size_t k = 0;
  for (const auto& m : lora_.modules) {
    at::Tensor a = parts[k++].view(m.a.sizes()), b = parts[k++].view(m.b.sizes());
    lora_cast_[&m] = {std::move(a), std::move(b)};
  }
}

at::Tensor DecoderModel::embed(const at::Tensor& ids) const {
  at::Tensor h = at::embedding(w("model.embed_tokens.weight"), ids);
  // gemma3_text: times sqrt(hidden_size), the fp32 scalar rounded to the weights' dtype as transformers does.
  if (cfg_.embed_scale > 0) h = h * at::scalar_tensor(cfg_.embed_scale, at::kFloat).to(h.device(), h.scalar_type());
  return h;
}

ModelOutput DecoderModel::forward(const Batch& batch, bool want_logits) { return forward_embeds(batch, want_logits, {}, {}); }

ModelOutput DecoderModel::forward_embeds(const Batch& batch, bool want_logits, const at::Tensor& embeds,
                                         const at::Tensor& rope_pos, const LayerHook& after_layer,
                                         const at::Tensor& attention_groups) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2)
    throw UsageError("model forward: input_ids must be [B, S]");
  const int64_t B = batch.input_ids.size(0), S = batch.input_ids.size(1), T = B * S;
  if (S == 0 || B == 0) throw UsageError("model forward: empty batch");
  auto same_shape = [&](const at::Tensor& t, const char* what) {
    if (t.defined() && t.sizes() != batch.input_ids.sizes())
      throw UsageError(ax::str("model forward: ", what, " has shape ", shape_str(t.sizes().vec()), ", input_ids ", shape_str(batch.input_ids.sizes().vec())));
  };
  same_shape(batch.labels, "labels");
  same_shape(batch.position_ids, "position_ids");
  // Validation reads host data only: what the batch recorded while it was on the CPU (make_batch,
  // Batch::to), or the tensors themselves when they are on the CPU. Only a device batch built without those
  // facts is read back, a host sync that stalls the GPU and cannot be captured in a CUDA graph.
  at::Tensor cu_host;  // the samples on the host, checked (context parallelism's split is cut by them)
  if (batch.cu_seqlens.defined()) {
    at::Tensor c = (batch.cu_seqlens_host.defined() ? batch.cu_seqlens_host : batch.cu_seqlens).to(at::kCPU, at::kLong);
    cu_host = c;
    if (c.dim() != 1 || c.size(0) < 2 || c[0].item<int64_t>() != 0 || c[-1].item<int64_t>() != T ||
        (c.narrow(0, 1, c.size(0) - 1) < c.narrow(0, 0, c.size(0) - 1)).any().item<bool>())
      throw UsageError(str("model forward: cu_seqlens must rise from 0 to B*S = ", T));
    if (batch.max_seqlen > 0 && (c.narrow(0, 1, c.size(0) - 1) - c.narrow(0, 0, c.size(0) - 1)).max().item<int64_t>() > batch.max_seqlen)
      throw UsageError("model forward: a sample is longer than max_seqlen");
  }
  {
    const at::Tensor& given = batch.input_ids;
    int64_t lo = batch.min_token_id, hi = batch.max_token_id;
    if (given.is_cpu() || hi < lo) lo = given.min().item<int64_t>(), hi = given.max().item<int64_t>();
    if (lo < 0 || hi >= cfg_.vocab_size) throw UsageError(str("model forward: token ids must be in [0, ", cfg_.vocab_size, ")"));
  }
  at::Tensor ids = batch.input_ids.to(device_, at::kLong).reshape({T});
  at::Tensor pos = batch.position_ids.defined() ? batch.position_ids.to(device_, at::kLong).reshape({T})
                                                : at::arange(S, at::TensorOptions().dtype(at::kLong).device(device_)).repeat({B});
  at::Tensor cu = batch.cu_seqlens.defined()
                      ? batch.cu_seqlens.to(device_, at::kInt)
                      : (at::arange(B + 1, at::TensorOptions().dtype(at::kInt).device(device_)) * int(S));
  int64_t max_len = batch.cu_seqlens.defined() && batch.max_seqlen > 0 ? batch.max_seqlen : S;

  // Dynamic RoPE's frequencies follow the batch's longest position + 1: max_seqlen of a batch make_batch built
  // (positions restart at 0 in every span), else the positions themselves (read back: a sync, dynamic only).
  at::Tensor inv_freq = inv_freq_;
  if (cfg_.rope.type == "dynamic") {
    int64_t seq_len = S;
    if (batch.position_ids.defined())
      seq_len = batch.cu_seqlens_host.defined() && batch.max_seqlen > 0 && !batch.position_ids.is_cpu()
                    ? batch.max_seqlen
                    : batch.position_ids.max().item<int64_t>() + 1;
    if (seq_len > cfg_.rope.max_position) inv_freq = rope_inv_freq(cfg_, seq_len).to(device_);
  }
  // Context parallelism: a training forward runs this rank's tokens of every row (models/context_parallel.hpp).
  cp_split_.reset();
  if (cp_ && cp_->size() > 1 && !want_logits && !decode_step_ && batch.labels.defined()) {
    if (embeds.defined() || rope_pos.defined() || attention_groups.defined())
      throw UsageError(str("model forward: context parallelism does not split ", cfg_.model_type,
                           " (given embeddings, multimodal RoPE or attention groups)"));
    if (S % (2 * cp_->size()) != 0)
      throw UsageError(str("model forward: 2 x context_parallel = ", 2 * cp_->size(),
                           " does not divide the row length ", S, " (each rank holds 2 chunks of every row)"));
    // The samples' host table once per step, for every layer's ring / Gated DeltaNet chunks (no read-back there).
    cp_split_ = ContextSplit{cp_.get(), B, S, host_boundaries(cu_host.defined() ? cu_host : at::arange(B + 1, at::kLong) * S)};
  }
  struct ResetSplit {
    std::optional<ContextSplit>& s;
    ~ResetSplit() { s.reset(); }
  } reset_split{cp_split_};
  const std::optional<ContextSplit> split = cp_split_;
  at::Tensor h = embeds.defined() ? embeds : embed(split ? split->local(ids) : ids);
  if (rope_pos.defined() && (rope_pos.dim() != 2 || rope_pos.size(0) != 3 || rope_pos.size(1) != T || cfg_.mrope_section.empty()))
    throw UsageError("model forward: multimodal RoPE positions must be [3, B*S], for a config with mrope_section");
  // Layers rotate by rope_pos ([3, T]: multimodal RoPE) where given; pos stays the 1-D sample positions (targets).
  const at::Tensor rpos = rope_pos.defined() ? rope_pos.to(device_, at::kLong) : split ? split->local(pos) : pos;
  if (attention_groups.defined() && (attention_groups.dim() != 1 || attention_groups.size(0) != T))
    throw UsageError(str("model forward: attention groups must be [B*S] = [", T, "]"));
  attention_groups_ = attention_groups;
  std::vector<at::Tensor> router_logits;
  const bool recompute = recompute_layers_ && training_ && at::GradMode::is_enabled();
  if (recompute) lora_cast_.clear();
  else cast_lora_factors();
  const LayerInputs in{rpos, cu, max_len, inv_freq};
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    if (!recompute) {
      h = layer(i, h, in, router_logits);
      if (after_layer) h = after_layer(i, h);
      continue;
    }
    // Everything the layer reads is captured by value: backward runs it again after forward returned.
    auto outs = autograd::recompute([this, i, in, split, groups = attention_groups_](const at::Tensor& x) {
      std::vector<at::Tensor> r;
      cp_split_ = split;  // in backward, after forward returned: the layer's split again
      ResetSplit reset{cp_split_};
      attention_groups_ = groups;  // backward may run it after another forward
      at::Tensor y = layer(i, x, in, r);
      r.insert(r.begin(), y);
      return r;
    }, h);
    h = outs[0];
    if (outs.size() > 1) router_logits.push_back(outs[1]);
    if (after_layer) h = after_layer(i, h);
  }
  h = rms_norm(h, "model.norm.weight").first;

  ModelOutput out;
  at::Tensor tgt;
  if (batch.labels.defined()) {
    // HF's ForCausalLMLoss: labels shifted left by one, fp32 logits, mean over non-ignored targets. A target
    // that starts a packed sample (position 0) is not predicted from the previous sample.
    tgt = next_token_targets(batch.labels.to(device_, at::kLong).reshape({B, S}), pos.reshape({B, S})).reshape({T});
  }
  // Context parallelism: this rank's targets, over the whole micro-batch's count (the shares add up to its mean).
  const at::Tensor whole_tgt = tgt;
  at::Tensor count;
  if (split && tgt.defined()) {
    count = tgt.ne(-100).sum().to(at::kFloat);
    tgt = split->local(tgt);
  }
  // The LM head and the loss in one op (the [T, V] logits never exist whole) when only the loss is wanted.
  if (tgt.defined() && !want_logits) out.loss = fused_loss(h, tgt, count);
  at::Tensor logits;
  if (want_logits || (tgt.defined() && !out.loss.defined())) logits = linear(h, "lm_head");  // [T, V]
  if (tgt.defined() && !out.loss.defined())
    out.loss = count.defined() ? at::cross_entropy_loss(logits.to(at::kFloat), tgt, {}, at::Reduction::Sum, -100) / count.clamp_min(1.0)
                               : at::cross_entropy_loss(logits.to(at::kFloat), tgt, {}, at::Reduction::Mean, -100);
  if (tgt.defined()) {
    // A batch without a single target would be a mean over nothing: NaN. It is 0 instead (and so are its
    // gradients), without a device sync; where() passes the loss through bit for bit otherwise.
    out.loss = at::where(whole_tgt.ne(-100).any(), out.loss, at::zeros_like(out.loss));
  }
  // Context parallelism: the aux loss over every token of the rows (the router logits gathered); each rank adds
  // 1/N of it, so the shares still sum to the single-process loss and the gather's backward sums their gradients.
  if (split)
    for (auto& r : router_logits) r = split->gather(r);
  if (!router_logits.empty()) {
    // make_batch marks padding in extras["attention_mask"] (1 = token, 0 = padding): left out of the aux
    // loss as transformers leaves it out given the attention mask.
    at::Tensor mask;
    if (auto it = batch.extras.find("attention_mask"); it != batch.extras.end()) {
      if (it->second.sizes() != batch.input_ids.sizes())
        throw UsageError(str("model forward: extras[\"attention_mask\"] has shape ", shape_str(it->second.sizes().vec()),
                             ", input_ids ", shape_str(batch.input_ids.sizes().vec())));
      mask = it->second.to(device_, at::kFloat).reshape({T});
    }
    out.aux_loss = aux_loss(router_logits, mask);
    if (out.loss.defined() && cfg_.output_router_logits)
      out.loss = out.loss + (cfg_.router_aux_loss_coef / double(split ? split->comm->size() : 1)) * out.aux_loss;
  }
  if (split && out.loss.defined()) out.loss = context_parallel_loss(*split->comm, out.loss);
  if (want_logits) out.logits = logits.view({B, S, cfg_.vocab_size});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> DecoderModel::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [n, t] : weights_)
    if (!unfrozen_.count(n)) out.emplace_back(n, t);  // an unfrozen one is listed with the trainable ones
  for (const auto& [n, wt] : frozen_) {
    if (cfg_.tie_word_embeddings && n == "lm_head.weight") continue;  // it is model.embed_tokens.weight
    if (unfrozen_.count(n)) continue;
    if (wt.is_dense()) {
      out.emplace_back(n, wt.values);
      continue;
    }
    out.emplace_back(n, wt.codes);
    out.emplace_back(n + ".scales", wt.scales);
    if (wt.nested_scales.defined()) out.emplace_back(n + ".nested_scales", wt.nested_scales);
    if (wt.global_scale.defined()) out.emplace_back(n + ".global_scale", wt.global_scale);
  }
  for (const auto& p : trainable_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> DecoderModel::trainable_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& m : lora_.modules) {
    out.emplace_back(m.site.path + ".lora_A", m.a);
    out.emplace_back(m.site.path + ".lora_B", m.b);
  }
  for (const auto& [n, t] : unfrozen_) out.emplace_back(n, t);
  return out;
}

void DecoderModel::save_adapter(const std::string& dir) const {
  if (!unfrozen_.empty()) return save_trained(dir);  // decoder_unfrozen.cpp
  if (lora_.modules.empty()) throw UsageError("save_adapter: the model has no LoRA adapter");
  if (ep_) {
    // This rank holds some experts' LoRA only: the checkpoint is the adapter gather_expert_lora assembled.
    if (!ep_gathered_) throw RuntimeError("save_adapter: expert parallel model without gather_expert_lora first");
    save_peft(*ep_gathered_, dir);
    return;
  }
  save_peft(lora_, dir);
}

std::vector<LoraSite> DecoderModel::lora_sites() const { return models::lora_sites(cfg_); }

std::vector<LoraSite> lora_sites(const HfConfig& c) {
  std::vector<LoraSite> out;
  const auto layers = assemble_layers(c);
  for (std::size_t i = 0; i < layers.size(); ++i) layer_lora_sites(c, layers[i], layer_prefix(static_cast<int64_t>(i)), out);
  // A multimodal checkpoint's language model sits under model.language_model. in peft's module tree.
  if (c.text_part)
    for (auto& s : out) s.peft_path = "model.language_model." + s.path.substr(6);
  return out;
}

}  // namespace ax::models
