// DecoderModel's load: every tensor of the assembled layers read from the checkpoint (fused or per-expert,
// bitsandbytes- or MXFP4-packed, fine-grained FP8) onto the device, packed into the weight policy's format where
// it says so, this rank's experts only under expert parallelism, handed layer by layer to a residency under
// shard_base; then every kernel the model calls resolved (decoder_plan.hpp).
#include "models/decoder.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/ops/quantizer.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/bnb_load.hpp"
#include "models/decoder_plan.hpp"
#include "models/fp8_load.hpp"
#include "models/gpt_oss.hpp"
#include "models/storage_set.hpp"
#include "models/tied_head.hpp"
#include "models/weight_policy.hpp"

namespace ax::models {

namespace {

// i of a name under "model.layers.i.", else -1.
int64_t layer_of(const std::string& name) {
  static const std::string head = "model.layers.";
  if (name.compare(0, head.size(), head) != 0) return -1;
  return std::stoll(name.substr(head.size(), name.find('.', head.size()) - head.size()));
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
  layers_ = assemble_layers(cfg_);
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

}  // namespace ax::models
