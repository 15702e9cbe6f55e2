#include "models/decoder.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/ops/quantizer.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/bnb_load.hpp"
#include "models/fp8_load.hpp"
#include "models/decoder_plan.hpp"
#include "models/gpt_oss.hpp"
#include "models/parts/gated_deltanet.hpp"
#include "models/parts/mla_layer.hpp"
#include "models/parts/shared_expert.hpp"
#include "models/recompute.hpp"
#include "models/ring_attention.hpp"
#include "models/storage_set.hpp"
#include "models/tied_head.hpp"
#include "models/tiled_mlp.hpp"
#include "models/weight_policy.hpp"

namespace ax::models {

namespace {

std::string layer_prefix(int64_t i) { return str("model.layers.", i, "."); }

// The group router's correction bias stays fp32 in any compute dtype, as transformers keeps it
// (_keep_in_fp32_modules_strict): in bf16 its small differences between experts would round away.
bool keeps_fp32(const std::string& name) {
  static const std::string tail = ".e_score_correction_bias";
  return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// i of a name under "model.layers.i.", else -1.
int64_t layer_of(const std::string& name) {
  static const std::string head = "model.layers.";
  if (name.compare(0, head.size(), head) != 0) return -1;
  return std::stoll(name.substr(head.size(), name.find('.', head.size()) - head.size()));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}

// Tokens per expert, int64 [E]. Not at::bincount: on CUDA it reads the largest index back to size its
// output (a host sync per MoE layer); the counts are integers, so the sum is exact in any order.
at::Tensor expert_counts(const at::Tensor& expert_idx, int64_t E) {
  return at::zeros({E}, expert_idx.options().dtype(at::kLong)).scatter_add_(0, expert_idx, at::ones_like(expert_idx, at::kLong));
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

// Storage bytes of `ts`, each storage counted once (views and tied weights share one).
int64_t tensor_bytes(const std::vector<at::Tensor>& ts) {
  std::set<const void*> seen;
  int64_t total = 0;
  for (const auto& t : ts)
    if (t.defined() && seen.insert(t.storage().data()).second) total += static_cast<int64_t>(t.storage().nbytes());
  return total;
}

std::string bytes_per_param(int64_t bytes, int64_t params) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", params ? double(bytes) / double(params) : 0.0);
  return buf;
}


}  // namespace

DecoderModel::DecoderModel(HfConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                           std::shared_ptr<KernelSet> kernels, const WeightPolicy& policy,
                           std::shared_ptr<ExpertComm> expert_parallel, std::shared_ptr<LayerResidency> layers)
    : cfg_(std::move(cfg)), dtype_(dtype), device_(device), kernels_(std::move(kernels)), ep_(std::move(expert_parallel)) {
  if (!kernels_) throw RuntimeError("DecoderModel: no KernelSet given");
  untie_stored_head(cfg_, ckpt);  // a stored head that differs from the embeddings is kept, as transformers does
  // Every tensor against the config from the headers, as `validate` checks it, before anything is allocated.
  check_checkpoint(cfg_, ckpt);
  init_expert_parallel();  // models/expert_parallel.cpp: ep_first_, ep_local_ (all experts without it)
  const auto tensors = internal_tensors(cfg_);
  const WeightPlan plan = weight_plan(cfg_, policy);
  const BnbConfig& bnb = cfg_.quant;
  std::shared_ptr<ops::Quantizer> quantizer;
  if (!quantize_format(cfg_, plan).empty()) quantizer = kernels_->quantizer(quantize_format(cfg_, plan));
  std::set<std::string> used;
  at::Tensor nested_code, nested_code_dev;  // the double-quant code, one per checkpoint (on the CPU) and device
  // In the checkpoint's dtype on the device: a packed projection is quantised from exactly the stored values.
  auto take = [&](const std::string& key, const std::vector<int64_t>& shape) {
    check_tensor_header(cfg_, ckpt, key, shape);
    used.insert(key);
    if (fp8_stored(ckpt, key)) {  // fine-grained FP8: dequantised in fp32 here, cast to the compute dtype by hold
      used.insert(fp8_scale_key(key));
      return read_fp8_dequantized(cfg_.fp8, cfg_.source, ckpt, key).to(device_);
    }
    return ckpt.get(key).to(device_);
  };
  // Resident bytes, counted as tensors are kept; the peak adds the dense tensor being converted or packed.
  int64_t resident = 0;
  StorageSet packed_storages;  // a quantizer may share a field (the double-quant code) between weights
  std::string fp8_why;  // weight_format fp8: why the projection being held is not kept in FP8 (fp8_kept_why)
  auto hold = [&](const std::string& name, at::Tensor raw, int64_t transient) {
    stats_.params += raw.numel();
    std::string why;
    const ops::QuantizeSpec spec = plan.spec_for(name, raw.sizes().vec(), why);
    if (bnb.present) why = "stored unpacked in the pre-quantised checkpoint";
    if (!fp8_why.empty()) why = fp8_why;
    if (why.empty()) {
      ops::WeightTensor q = quantizer->quantize(raw, spec);
      int64_t b = 0;
      for (const at::Tensor* t : {&q.values, &q.codes, &q.scales, &q.nested_scales, &q.nested_code, &q.global_scale})
        if (t->defined() && packed_storages.insert(*t)) b += static_cast<int64_t>(t->storage().nbytes());
      stats_.peak_bytes = std::max(stats_.peak_bytes, resident + transient + tensor_bytes({raw}) + b);
      stats_.packed_params += raw.numel();
      stats_.packed_bytes += b;
      resident += b;
      frozen_[name] = std::move(q);
      return;
    }
    at::Tensor v = raw.to(keeps_fp32(name) ? at::kFloat : dtype_);
    stats_.peak_bytes = std::max(stats_.peak_bytes, resident + transient + tensor_bytes({raw, v}));
    resident += tensor_bytes({v});
    if (!is_projection(name)) {
      weights_[name] = std::move(v);
      return;
    }
    // lm_head is dense by policy; list the projections kept against the format (skip_modules, misfits).
    if ((plan.format() != ops::WeightFormat::dense || bnb.present) && name != "lm_head.weight")
      stats_.kept.push_back(str(module_path(name), " (", why, ")"));
    frozen_[name] = ops::WeightTensor::dense(std::move(v));
  };
  // A weight stored packed (bitsandbytes): read as nf4, byte for byte. Where the model holds a plain tensor
  // (lm_head, a router) or skip_modules names the projection, it is dequantised instead: exactly the values
  // bitsandbytes computes from the checkpoint, in the compute dtype.
  auto read_packed = [&](const std::string& key, const std::vector<int64_t>& shape) {
    for (const auto& k : bnb_field_keys(ckpt, key)) used.insert(k);
    ops::WeightTensor q = read_bnb_nf4(ckpt, key, shape, nested_code);
    if (policy.format == "nf4" && q.blocksize != policy.blocksize)
      throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' is packed with blocksize ", q.blocksize,
                           " but the config asks for model.quant_blocksize = ", policy.blocksize,
                           " (leave weight_format unset to take the checkpoint as stored)"));
    return q;
  };
  auto hold_packed = [&](const std::string& name, ops::WeightTensor q) {
    if (ep_ && name.find("mlp.experts.") != std::string::npos)
      throw UsageError(str(ckpt.source(), ": '", name, "' is stored packed (", ops::to_string(q.format), "); [distributed] "
                           "expert_parallel splits dense expert weights only (quantise at load with model.weight_format",
                           q.format == ops::WeightFormat::fp8 ? ", or leave it unset to dequantise the FP8 checkpoint" : "",
                           ")"));
    const int64_t numel = q.numel();
    stats_.params += numel;
    std::string skip;
    for (const auto& entry : policy.skip_modules)
      if (skip.empty() && skip_entry_matches(module_path(name), entry)) skip = entry;
    if (!is_projection(name) || name == "lm_head.weight" || !skip.empty()) {
      at::Tensor v = ops::dequantize(q.to(device_), dtype_);
      stats_.peak_bytes = std::max(stats_.peak_bytes, resident + tensor_bytes({v}) + ops::weight_bytes(q));
      resident += tensor_bytes({v});
      if (!skip.empty()) stats_.kept.push_back(str(module_path(name), " (skip_modules '", skip, "', dequantised)"));
      if (is_projection(name)) frozen_[name] = ops::WeightTensor::dense(std::move(v));
      else weights_[name] = std::move(v);
      return;
    }
    q = q.to(device_);
    if (q.nested_code.defined()) {
      if (!nested_code_dev.defined()) nested_code_dev = q.nested_code;
      q.nested_code = nested_code_dev;
    }
    if (q.format == ops::WeightFormat::nf4 && name.find("mlp.experts.") != std::string::npos && (numel / q.shape[0]) % q.blocksize != 0)
      throw UsageError(str(ckpt.source(), ": '", name, "': an expert's ", numel / q.shape[0],
                           " elements are not a multiple of its blocksize ", q.blocksize, " (moe.experts dequantises per expert)"));
    int64_t b = 0;
    for (const at::Tensor* t : {&q.codes, &q.scales, &q.nested_scales, &q.nested_code})
      if (t->defined() && packed_storages.insert(*t)) b += static_cast<int64_t>(t->storage().nbytes());
    resident += b;
    stats_.peak_bytes = std::max(stats_.peak_bytes, resident);
    stats_.packed_params += numel;
    stats_.packed_bytes += b;
    frozen_[name] = std::move(q);
  };
  // A fused expert tensor [E, ...] narrowed to this rank's experts (a copy: the rest is not kept).
  auto local_experts = [&](at::Tensor t) {
    if (!ep_ || t.dim() == 0 || t.size(0) != cfg_.num_experts) return t;
    return t.narrow(0, ep_first_, ep_local_).clone();
  };
  // shard_base: layer i goes to `layers` once the load holds all of it (internal_tensors lists the tensors
  // layer by layer, whatever order the checkpoint stores them in), so only one layer is ever whole here.
  StorageSet whole_seen;  // whole_bytes_: each storage once, the handed-over layers' included
  int64_t open_layer = -1, handed = 0;
  auto layer_done_unless = [&](int64_t next) {
    if (!layers || next == open_layer) return;
    if (open_layer >= 0) {
      const HandOver h = hand_over_layer(open_layer, *layers, whole_seen);
      stats_.peak_bytes = std::max(stats_.peak_bytes, resident + h.kept);  // the chunk is made before the layer goes
      resident += h.kept - h.freed;
      whole_bytes_ += h.whole;
      ++handed;
    }
    if (next >= 0 && next < handed) throw RuntimeError(str("DecoderModel: layer ", next, "'s tensors are not listed together"));
    open_layer = next;
  };
  for (auto& [name, shape] : tensors) {
    layer_done_unless(layer_of(name));
    const TensorSource src = tensor_source(cfg_, ckpt, name, shape);  // the layout check_checkpoint checked
    const bool experts = name.find("mlp.experts.") != std::string::npos;  // fused [E, ...]: this rank's share
    if (src.mxfp4) {  // gpt_oss: packed, as stored
      ops::WeightTensor q = read_gpt_oss_mxfp4(ckpt, name, shape, cfg_.source);
      used.insert(name + "_blocks");
      used.insert(name + "_scales");
      hold_packed(name, std::move(q));
      continue;
    }
    if (src.bnb && !src.per_expert) {
      hold_packed(name, read_packed(src.keys[0].first, shape));
      continue;
    }
    fp8_why.clear();
    if (plan.format() == ops::WeightFormat::fp8 && is_projection(name)) {
      // weight_format fp8: the projection as stored (fp8 bytes and scales), unless fp8_kept_why says why not; then
      // it reads dequantised below, as without the key.
      fp8_why = fp8_kept_why(cfg_, ckpt, plan, name, src);
      if (fp8_why.empty()) {
        const int64_t per = src.per_expert ? static_cast<int64_t>(src.keys.size()) / cfg_.num_experts : 1;
        std::vector<ops::WeightTensor> parts;
        for (int64_t i = src.per_expert ? ep_first_ * per : 0; i < (src.per_expert ? (ep_first_ + ep_local_) * per : 1); ++i) {
          const auto& [key, key_shape] = src.keys[static_cast<std::size_t>(i)];
          check_tensor_header(cfg_, ckpt, key, key_shape);
          used.insert(key);
          used.insert(fp8_scale_key(key));
          parts.push_back(read_fp8_packed(cfg_.fp8, cfg_.source, ckpt, key));
        }
        hold_packed(name, src.per_expert ? stack_fp8_experts(parts, per) : parts.front());
        continue;
      }
    }
    if (src.bnb) {
      // Per-expert weights packed by bitsandbytes: one nf4 weight of the fused shape, in the same order as the
      // dense path stacks them (gate then up of each expert).
      std::vector<ops::WeightTensor> parts;
      for (const auto& [key, key_shape] : src.keys) parts.push_back(read_packed(key, key_shape));
      hold_packed(name, concat_nf4(parts, shape, str(ckpt.source(), ": '", name, "'")));
      continue;
    }
    if (!src.per_expert) {
      const auto& [key, key_shape] = src.keys[0];
      at::Tensor t = take(key, key_shape);
      if (src.transposed) t = gpt_oss_from_checkpoint(name, t);  // the expert matrices into ENK
      hold(name, experts ? local_experts(std::move(t)) : std::move(t), 0);
      continue;
    }
    // Per-expert dense weights: this rank's experts only (all of them without expert parallelism), each
    // expert's keys (gate and up, or down) one after another in src.keys.
    const int64_t per = static_cast<int64_t>(src.keys.size()) / cfg_.num_experts;
    std::vector<at::Tensor> parts;
    for (int64_t e = ep_first_; e < ep_first_ + ep_local_; ++e) {
      std::vector<at::Tensor> pieces;
      for (int64_t j = 0; j < per; ++j) pieces.push_back(take(src.keys[e * per + j].first, src.keys[e * per + j].second));
      parts.push_back(per == 1 ? pieces[0] : at::cat(pieces, 0));
    }
    at::Tensor stacked = at::stack(parts, 0).contiguous();
    const int64_t part_bytes = tensor_bytes(parts);
    parts.clear();
    hold(name, std::move(stacked), part_bytes);
  }
  layer_done_unless(-1);
  if (cfg_.tie_word_embeddings) frozen_["lm_head.weight"] = ops::WeightTensor::dense(weights_.at("model.embed_tokens.weight"));
  // Layers past num_hidden_layers are the MTP (multi-token prediction) head GLM-4.5 and DeepSeek-V3 checkpoints
  // append, which transformers ignores too: one line for all of them, not one per tensor.
  int64_t beyond = 0;
  for (const auto& n : ckpt.names()) {
    if (used.count(n) || (cfg_.tie_word_embeddings && n == "lm_head.weight")) continue;
    if (layer_of(n) >= cfg_.num_layers) ++beyond;
    else log::warn(str(ckpt.file_of(n), ": tensor '", n, "' is not used by the ", cfg_.model_type, " model"));
  }
  if (beyond > 0)
    log::info(str(ckpt.source(), ": ", beyond, " tensors of layers past num_hidden_layers = ", cfg_.num_layers,
                  " (an MTP head) are not used, as transformers leaves them"));
  inv_freq_ = rope_inv_freq(cfg_).to(device_);
  if (cfg_.has_local_rope) inv_freq_local_ = rope_inv_freq(cfg_, cfg_.rope_local).to(device_);

  std::vector<at::Tensor> all;
  for (const auto& [n, t] : weights_) all.push_back(t);
  for (const auto& [n, wt] : frozen_)
    for (const at::Tensor* t : {&wt.values, &wt.codes, &wt.scales, &wt.nested_scales, &wt.nested_code, &wt.global_scale})
      if (t->defined()) all.push_back(*t);
  stats_.bytes = tensor_bytes(all);
  if (layers) {
    for (const auto& t : all)
      if (t.defined() && whole_seen.insert(t)) whole_bytes_ += static_cast<int64_t>(t.storage().nbytes());
    set_layer_residency(std::move(layers));  // stats_.bytes: what is held here plus the owner's share
  } else {
    whole_bytes_ = stats_.bytes;
  }
  stats_.format = bnb.present ? (stats_.packed_params > 0 ? "nf4" : "dense")
                 : policy.format == "fp8" && stats_.packed_params == 0 ? "dense"
                 : cfg_.mxfp4_experts && policy.format == "dense" ? "mxfp4" : policy.format;
  if (stats_.format != "dense") {
    log::info(str("base weights: ", stats_.packed_params, " of ", stats_.params, " parameters in ", stats_.format, " (",
                  bytes_per_param(stats_.packed_bytes, stats_.packed_params), " bytes/param incl. scales); resident ",
                  stats_.bytes, " bytes, peak ", stats_.peak_bytes, " while loading"));
    if (!stats_.kept.empty()) log::info(str("  kept in ", ops::dtype_name(dtype_), ": ", join(stats_.kept, ", ")));
  }
  // Every kernel call the model makes (decoder_plan.hpp: the plan validate, `plugins explain` and kernels.strict
  // check) resolves now: a missing backend fails the load, not a later step. The plan comes from the formats
  // check_checkpoint's headers predict; the ones held must be those, or validate checked another model.
  std::map<std::string, ops::WeightFormat> held;
  for (const auto& [n, wt] : frozen_) held[n] = wt.format;
  const auto predicted = held_formats(cfg_, plan, ckpt);
  if (held != predicted) {
    std::vector<std::string> diff;
    for (const auto& [n, f] : held)
      if (!predicted.count(n) || predicted.at(n) != f)
        diff.push_back(str(n, " held ", ops::to_string(f), ", predicted ", predicted.count(n) ? ops::to_string(predicted.at(n)) : "none"));
    throw RuntimeError(str("DecoderModel: the formats held differ from held_formats (", join(diff, "; "), ")"));
  }
  for (const auto& c : decoder_calls(cfg_, held)) kernels_->get_backend(c.op, ops::dtype_name(dtype_), c.format, c.layout);
}

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

at::Tensor DecoderModel::attention_block(int64_t i, const at::Tensor& x, const at::Tensor& pos, const at::Tensor& cu,
                                         int64_t max_len, const at::Tensor& inv_freq) {
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

at::Tensor DecoderModel::dense_mlp(int64_t i, const at::Tensor& x) {
  const std::string p = layer_prefix(i) + "mlp.";
  if (!swiglu_mlp(cfg_))  // gemma3_text: gelu(gate) * up, plain ATen (no fused op for it)
    return linear(at::gelu(linear(x, p + "gate_proj"), "tanh") * linear(x, p + "up_proj"), p + "down_proj");
  ops::SwigluArgs a;
  a.gate = linear(x, p + "gate_proj");
  a.up = linear(x, p + "up_proj");
  at::Tensor act = autograd::swiglu(kernels_->get<ops::Swiglu>(ops::dtype_name(dtype_)), std::move(a));
  return linear(act, p + "down_proj");
}

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

ops::MoeRouting DecoderModel::moe_routing(const at::Tensor& top_i) const {
  ops::MoeRouting routing;
  const int64_t E = cfg_.num_experts;
  at::Tensor flat = top_i.reshape({-1});
  // Sorted on the narrowest key type that holds every expert id: a stable sort's permutation does not depend
  // on the key type, but CUDA's radix sort makes one pass (a kernel and a memset) per key byte, 8 for int64.
  const at::ScalarType key = E <= 256 ? at::kByte : E <= 32768 ? at::kShort : at::kLong;
  auto [sorted, perm] = flat.to(key).sort(/*stable=*/true, 0, false);
  routing.sorted_expert_idxs = sorted.to(at::kLong);
  routing.sorted_scattered_idxs = perm;
  // End offsets read off the sorted ids (entries with expert <= e): one search instead of a count's fill,
  // scatter_add and cumsum.
  routing.expert_offsets = at::searchsorted(routing.sorted_expert_idxs, at::arange(E, flat.options().dtype(at::kLong)),
                                            /*out_int32=*/false, /*right=*/true);
  routing.top_k = top_i.size(-1);
  return routing;
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

at::Tensor DecoderModel::embed(const at::Tensor& ids) const {
  at::Tensor h = at::embedding(w("model.embed_tokens.weight"), ids);
  // gemma3_text: times sqrt(hidden_size), the fp32 scalar rounded to the weights' dtype as transformers does.
  if (cfg_.embed_scale > 0) h = h * at::scalar_tensor(cfg_.embed_scale, at::kFloat).to(h.device(), h.scalar_type());
  return h;
}

at::Tensor DecoderModel::layer(int64_t i, const at::Tensor& h, const at::Tensor& pos, const at::Tensor& cu, int64_t max_len,
                               const at::Tensor& inv_freq,
                               std::vector<at::Tensor>& router_logits) {
  ResidentLayer resident(residency_.get(), i);  // shard_base: the layer's tensors are here only while it runs
  const std::string p = layer_prefix(i);
  const at::Tensor& freq = cfg_.has_local_rope && cfg_.window(i) > 0 ? inv_freq_local_ : inv_freq;  // gemma3_text
  const at::Tensor in = rms_norm(h, p + "input_layernorm.weight").first;
  at::Tensor a = cfg_.is_linear_layer(i) ? gated_deltanet_block(i, in, cu)
                 : cfg_.is_mla()          ? mla_block(i, in, pos, cu, max_len, freq)
                                          : attention_block(i, in, pos, cu, max_len, freq);
  if (cfg_.sandwich_norms) {
    // gemma3_text: x = h + norm(attention); the MLP reads pre_feedforward_layernorm(x) and its output is
    // normed again before the residual add.
    auto [n, x] = rms_norm(rms_norm(a, p + "post_attention_layernorm.weight").first, p + "pre_feedforward_layernorm.weight", h);
    return x + rms_norm(tiled_mlp([this, i](const at::Tensor& t, std::vector<at::Tensor>&) { return dense_mlp(i, t); }, n,
                                  router_logits),
                        p + "post_feedforward_layernorm.weight").first;
  }
  // x = h + attention, then its norm: one rms_norm call with h as the residual (x is its `sum`).
  auto [n, x] = rms_norm(a, p + "post_attention_layernorm.weight", h);
  // The MLP / MoE block, in token shards with [train] tiled_mlp (models/tiled_mlp.hpp).
  auto block = [this, i](const at::Tensor& t, std::vector<at::Tensor>& rl) {
    if (!cfg_.is_moe_layer(i)) return dense_mlp(i, t);
    at::Tensor m = cfg_.moe_kind == MoeKind::topk_softmax_clamped ? gpt_oss_moe_block(i, t, rl)
                   : cfg_.moe_kind == MoeKind::group_topk_sigmoid ? group_moe_block(i, t)
                                                                   : moe_block(i, t, rl);
    if (cfg_.shared_expert_intermediate_size > 0) m = m + shared_expert(i, t);
    return m;
  };
  if (!cfg_.is_moe_layer(i) || mlp_shard_count(n.size(0)) <= 1) return x + tiled_mlp(block, n, router_logits);
  // Tiled MoE: packed experts decoded once per pass over the shards, not once per shard (ExpertWeightCache).
  auto cache = std::make_shared<ExpertWeightCache>(mlp_shard_count(n.size(0)));
  return x + tiled_mlp([block, cache](const at::Tensor& t, std::vector<at::Tensor>& rl) {
                         const ExpertCacheScope scope(cache.get());
                         return block(t, rl);
                       },
                       n, router_logits);
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
  if (batch.cu_seqlens.defined()) {
    at::Tensor c = (batch.cu_seqlens_host.defined() ? batch.cu_seqlens_host : batch.cu_seqlens).to(at::kCPU, at::kLong);
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
    cp_split_ = ContextSplit{cp_.get(), B, S};
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
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    if (!recompute) {
      h = layer(i, h, rpos, cu, max_len, inv_freq, router_logits);
      if (after_layer) h = after_layer(i, h);
      continue;
    }
    // Everything the layer reads is captured by value: backward runs it again after forward returned.
    auto outs = autograd::recompute([this, i, rpos, cu, max_len, inv_freq, split, groups = attention_groups_](const at::Tensor& x) {
      std::vector<at::Tensor> r;
      cp_split_ = split;  // in backward, after forward returned: the layer's split again
      ResetSplit reset{cp_split_};
      attention_groups_ = groups;  // backward may run it after another forward
      at::Tensor y = layer(i, x, rpos, cu, max_len, inv_freq, r);
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

std::vector<LoraSite> lora_sites(const HfConfig& cfg_) {
  std::vector<LoraSite> out;
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads;
  auto lin = [&](const std::string& path, const std::string& leaf, int64_t in, int64_t outf) {
    out.push_back(LoraSite{path, leaf, false, 1, in, outf});
  };
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    std::string p = layer_prefix(i);
    if (cfg_.is_linear_layer(i)) {
      gated_deltanet_lora_sites(cfg_, p, out);
    } else if (cfg_.is_mla()) {
      mla_lora_sites(cfg_, p, out);
    } else {
      lin(p + "self_attn.q_proj", "q_proj", H, Hq * D * (cfg_.attn_output_gate ? 2 : 1));
      lin(p + "self_attn.k_proj", "k_proj", H, Hkv * D);
      lin(p + "self_attn.v_proj", "v_proj", H, Hkv * D);
      lin(p + "self_attn.o_proj", "o_proj", Hq * D, H);
    }
    if (cfg_.is_moe_layer(i)) {
      // Every family's fused experts, gpt_oss's too (its checkpoint's [E, in, out] matrices are held ENK: the
      // sites' in/out are the same; peft's target_parameters LoRA, docs/models.md "gpt_oss expert LoRA").
      const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size;
      out.push_back(LoraSite{p + "mlp.experts.gate_up_proj", "gate_up_proj", true, E, H, 2 * I});
      out.push_back(LoraSite{p + "mlp.experts.down_proj", "down_proj", true, E, I, H});
      if (cfg_.shared_expert_intermediate_size > 0) shared_expert_lora_sites(cfg_, p, out);
    } else {
      const int64_t I = cfg_.intermediate_size;
      lin(p + "mlp.gate_proj", "gate_proj", H, I);
      lin(p + "mlp.up_proj", "up_proj", H, I);
      lin(p + "mlp.down_proj", "down_proj", I, H);
    }
  }
  // A multimodal checkpoint's language model sits under model.language_model. in peft's module tree.
  if (cfg_.text_part)
    for (auto& s : out) s.peft_path = "model.language_model." + s.path.substr(6);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> DecoderModel::merged_state_dict(at::ScalarType dtype) const {
  std::map<std::string, at::Tensor> merged;
  for (const auto& [n, t] : weights_) merged[n] = t.detach().to(at::kFloat);
  for (const auto& [n, wt] : frozen_)  // a packed base is dequantised: the merged model is dense
    merged[n] = wt.is_dense() ? wt.values.detach().to(at::kFloat) : ops::dequantize(wt, at::kFloat);
  for (const auto& m : lora_.modules) {
    std::string key = m.site.experts ? m.site.path : m.site.path + ".weight";
    merged[key] = merged.at(key) + lora_delta(m).to(merged[key].device());
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, shape] : internal_tensors(cfg_)) {
    bool router = name.size() > 15 && name.compare(name.size() - 15, 15, "mlp.gate.weight") == 0;
    bool experts = name.find("mlp.experts.") != std::string::npos;
    const at::Tensor& t = merged.at(name);
    if (keeps_fp32(name)) {  // saved in fp32 whatever the dtype, as transformers saves it
      out.emplace_back(name, t.to(at::kFloat).contiguous());
      continue;
    }
    if (cfg_.moe_kind == MoeKind::topk_softmax_clamped) {
      out.emplace_back(name, gpt_oss_to_checkpoint(name, t.to(dtype)).contiguous());
      continue;
    }
    if (!router && !experts) {
      out.emplace_back(name, t.to(dtype).contiguous());
      continue;
    }
    std::string p = name.substr(0, name.find("mlp."));
    ExpertKeys k = expert_keys(cfg_, p, true);
    const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size;
    if (router) out.emplace_back(k.router, t.to(dtype).contiguous());
    else if (name.find("gate_up_proj") != std::string::npos)
      for (int64_t e = 0; e < E; ++e) {
        out.emplace_back(with_expert(k.gate, e), t[e].narrow(0, 0, I).to(dtype).contiguous());
        out.emplace_back(with_expert(k.up, e), t[e].narrow(0, I, I).to(dtype).contiguous());
      }
    else
      for (int64_t e = 0; e < E; ++e) out.emplace_back(with_expert(k.down, e), t[e].to(dtype).contiguous());
  }
  return out;
}

}  // namespace ax::models
