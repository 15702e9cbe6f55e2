#include "models/decoder_checkpoint.hpp"

#include <algorithm>
#include <cctype>
#include <tuple>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/bnb_load.hpp"
#include "models/fp8_load.hpp"
#include "models/family.hpp"
#include "models/gpt_oss.hpp"
#include "models/layer_parts.hpp"
#include "models/parts/mla_layer.hpp"

namespace ax::models {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}

// The shape of plain 2-dim tensor `key` where the checkpoint holds one (a packed or missing one: null; the
// tensor walk reports those).
const std::vector<int64_t>* matrix(const HfConfig& c, const safetensors::Checkpoint& ckpt, const std::string& key) {
  if (!ckpt.has(key) || (c.quant.present && bnb_packed(ckpt, key))) return nullptr;
  const auto& s = ckpt.info(key).shape;
  return s.size() == 2 ? &s : nullptr;
}

// The [model] weight keys against a pre-quantised checkpoint: unset ("dense", the default) or "nf4" takes it as
// stored; "nf4" with quant keys that contradict it, or another format (a second quantisation), is an error.
void check_prequantised_policy(const WeightPolicy& p, const BnbConfig& b, const std::string& source) {
  auto yes = [](bool v) { return v ? "true" : "false"; };
  if (p.format != "dense" && p.format != "nf4")
    throw UsageError(str(source, ": the checkpoint is pre-quantised in nf4 (bitsandbytes); model.weight_format = \"",
                         p.format, "\" would quantise it a second time. Leave weight_format unset (or \"nf4\") to use "
                         "it as stored"));
  if (p.format == "nf4" && p.double_quant != b.double_quant)
    throw UsageError(str(source, ": quantization_config.bnb_4bit_use_double_quant is ", yes(b.double_quant),
                         " but the config has model.double_quant = ", yes(p.double_quant),
                         " (set it to match, or leave weight_format unset to take the checkpoint as stored)"));
}

std::vector<int64_t> swapped_last(std::vector<int64_t> s) {
  std::swap(s[s.size() - 2], s[s.size() - 1]);
  return s;
}

}  // namespace

bool experts_maybe_transposed(const HfConfig& c) { return c.num_experts > 0 && !c.mrope_section.empty(); }

safetensors::Checkpoint checkpoint_text_view(const HfConfig& c, const safetensors::Checkpoint& ckpt, int64_t* left_out) {
  if (!c.text_part) return ckpt;
  int64_t dropped = 0;
  auto view = ckpt.renamed([&](const std::string& n) -> std::optional<std::string> {
    static const std::string lm = "model.language_model.";
    if (n.rfind(lm, 0) == 0) return "model." + n.substr(lm.size());
    if (n.rfind("lm_head.", 0) == 0) return n;
    ++dropped;
    return std::nullopt;
  });
  if (left_out) *left_out = dropped;
  return view;
}

bool keeps_fp32(const std::string& name) { return ends_with(name, ".e_score_correction_bias"); }

TensorShapes internal_tensors(const HfConfig& c) {
  TensorShapes out;
  const int64_t H = c.hidden_size;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, H}});
  const auto layers = assemble_layers(c);  // each layer's parts list their tensors (models/layer_parts.hpp)
  for (std::size_t i = 0; i < layers.size(); ++i) layer_tensors(c, layers[i], layer_prefix(static_cast<int64_t>(i)), out);
  out.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, H}});
  return out;
}


ExpertKeys expert_keys(const HfConfig& c, const std::string& p, bool block_sparse) {
  // The family's per-expert names (models/family.hpp); fused-only families keep transformers 5's.
  const auto& names = family_of(c).per_expert;
  const PerExpertNames n = names ? *names : PerExpertNames{"gate_proj", "up_proj", "down_proj", ""};
  const std::string m = p + (block_sparse && !n.alt_block.empty() ? n.alt_block : std::string("mlp")) + ".";
  return {m + "gate.weight", m + "experts.{e}." + n.gate + ".weight", m + "experts.{e}." + n.up + ".weight",
          m + "experts.{e}." + n.down + ".weight"};
}

std::string with_expert(std::string pattern, int64_t e) {
  auto pos = pattern.find("{e}");
  return pattern.replace(pos, 3, std::to_string(e));
}

TensorShapes expected_checkpoint_tensors(const HfConfig& c) {
  TensorShapes out;
  for (auto& [name, shape] : internal_tensors(c)) {
    if (c.moe_kind == MoeKind::topk_softmax_clamped) {  // fused experts under their own names; two of them transposed
      out.push_back({name, gpt_oss_checkpoint_shape(name, shape)});
      continue;
    }
    auto pos = name.find("mlp.experts.");
    bool router = name.size() > 15 && name.compare(name.size() - 15, 15, "mlp.gate.weight") == 0;
    if (pos == std::string::npos && !router) {
      out.push_back({name, shape});
      continue;
    }
    if (experts_maybe_transposed(c)) {  // fused, as its save_pretrained writes them
      out.push_back({name, shape});
      continue;
    }
    std::string p = name.substr(0, name.find("mlp."));
    ExpertKeys k = expert_keys(c, p, true);
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
    if (router) out.push_back({k.router, shape});
    else if (name.find("gate_up_proj") != std::string::npos)
      for (int64_t e = 0; e < E; ++e) {
        out.push_back({with_expert(k.gate, e), {I, H}});
        out.push_back({with_expert(k.up, e), {I, H}});
      }
    else
      for (int64_t e = 0; e < E; ++e) out.push_back({with_expert(k.down, e), {H, I}});
  }
  return out;
}

TensorSource tensor_source(const HfConfig& c, const safetensors::Checkpoint& ckpt, const std::string& name,
                           const std::vector<int64_t>& shape) {
  TensorSource s;
  const bool router = ends_with(name, "mlp.gate.weight");
  const bool experts = name.find("mlp.experts.") != std::string::npos;
  if (c.moe_kind == MoeKind::topk_softmax_clamped && experts) {  // fused only; the expert matrices are transposed into ENK at load
    s.transposed = gpt_oss_transposed(name);
    s.mxfp4 = s.transposed && (ckpt.has(name + "_blocks") || ckpt.has(name + "_scales"));
    s.keys = {{name, s.mxfp4 ? shape : gpt_oss_checkpoint_shape(name, shape)}};
    return s;
  }
  if (!router && !experts) {
    s.keys = {{name, shape}};
    s.bnb = c.quant.present && bnb_packed(ckpt, name);
    return s;
  }
  // Fused (transformers 5 / converted) or per-expert (HF hub layout; Mixtral under block_sparse_moe).
  const std::string p = name.substr(0, name.find("mlp."));
  const auto& per_expert = family_of(c).per_expert;
  const bool block_sparse = per_expert && !per_expert->alt_block.empty() && !ckpt.has(p + "mlp.gate.weight");
  const ExpertKeys k = expert_keys(c, p, block_sparse);
  const std::string key = router ? k.router : name;
  if (router || ckpt.has(name)) {
    s.keys = {{key, shape}};
    s.bnb = c.quant.present && bnb_packed(ckpt, key);
    if (!router && experts_maybe_transposed(c) && ckpt.info(name).shape != shape && !s.bnb) {
      s.transposed = true;  // read as [E, H, 2I] / [E, I, H], transposed at load (the header check names that shape)
      s.keys = {{key, swapped_last(shape)}};
    }
    return s;
  }
  s.per_expert = true;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  const bool gate_up = name.find("gate_up_proj") != std::string::npos;
  for (int64_t e = 0; e < E; ++e) {
    if (gate_up) {
      s.keys.push_back({with_expert(k.gate, e), {I, H}});
      s.keys.push_back({with_expert(k.up, e), {I, H}});
    } else {
      s.keys.push_back({with_expert(k.down, e), {H, I}});
    }
  }
  s.bnb = c.quant.present && bnb_packed(ckpt, s.keys.front().first);
  return s;
}

void check_tensor_header(const HfConfig& c, const safetensors::Checkpoint& ckpt, const std::string& key,
                         const std::vector<int64_t>& shape) {
  const auto& info = ckpt.info(key);  // throws naming the checkpoint and tensor
  if (!c.quant.present && bnb_packed(ckpt, key))
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' is packed by bitsandbytes (it has a quant state) but ",
                         c.source, " has no bitsandbytes 4-bit quantization_config"));
  if (info.shape != shape)
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has shape ", shape_str(info.shape), " but ", c.source,
                         " implies ", shape_str(shape)));
  if (fp8_stored(ckpt, key)) {  // read dequantised (models/fp8_load.hpp): its scale and the config checked here
    check_fp8_weight(c.fp8, c.source, ckpt, key);
    return;
  }
  if (!at::isFloatingType(info.scalar_type))
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has non-float dtype ", info.dtype));
}

void check_checkpoint_sizes(const HfConfig& c, const safetensors::Checkpoint& ckpt) {
  // Layers: one past the highest index under model.layers.<i>. (a gap is a missing tensor, found later).
  int64_t present = 0;
  static const std::string head = "model.layers.";
  for (const auto& n : ckpt.names()) {
    if (n.compare(0, head.size(), head) != 0) continue;
    std::size_t k = head.size();
    int64_t i = 0;
    while (k < n.size() && std::isdigit(static_cast<unsigned char>(n[k])) && i < (int64_t(1) << 40)) i = i * 10 + (n[k++] - '0');
    if (k > head.size() && k < n.size() && n[k] == '.') present = std::max(present, i + 1);
  }
  if (c.num_layers > present)
    throw UsageError(str(c.source, ": 'num_hidden_layers' is ", c.num_layers, " but ", ckpt.source(), " holds ",
                         present == 0 ? std::string("no layer (no tensor under model.layers.)")
                                      : str("layers 0 to ", present - 1, " only (no tensor under model.layers.", present, ".)")));
  const std::string embed = "model.embed_tokens.weight";
  if (const auto* s = matrix(c, ckpt, embed)) {
    if ((*s)[0] != c.vocab_size)
      throw UsageError(str(c.source, ": 'vocab_size' is ", c.vocab_size, " but ", ckpt.file_of(embed), ": tensor '", embed,
                           "' has ", (*s)[0], " rows"));
    if ((*s)[1] != c.hidden_size)
      throw UsageError(str(c.source, ": 'hidden_size' is ", c.hidden_size, " but ", ckpt.file_of(embed), ": tensor '", embed,
                           "' has ", (*s)[1], " columns"));
  }
  // Heads × head_dim: the rows of the first attention layer's q and k projections (q doubled by an output gate).
  int64_t first_attn = 0;
  while (first_attn < c.num_layers && c.is_linear_layer(first_attn)) ++first_attn;
  for (const auto& [proj, heads, key, mult] : {std::tuple{"q_proj", c.num_heads, "num_attention_heads", c.attn_output_gate ? 2 : 1},
                                               std::tuple{"k_proj", c.num_kv_heads, "num_key_value_heads", 1}}) {
    if (first_attn == c.num_layers || c.is_mla()) break;  // MLA's projections: the tensor walk checks them
    const std::string name = layer_prefix(first_attn) + "self_attn." + proj + ".weight";
    const auto* s = matrix(c, ckpt, name);
    // [rows, hidden] with other rows: the heads or head_dim; another shape is the tensor's fault (the walk says).
    if (!s || (*s)[1] != c.hidden_size || (*s)[0] == mult * heads * c.head_dim) continue;
    throw UsageError(str(c.source, ": '", key, "' x 'head_dim' is ", heads, " x ", c.head_dim, " = ", heads * c.head_dim,
                         mult == 2 ? " (x 2: q and its output gate)" : "", " but ", ckpt.file_of(name), ": tensor '", name,
                         "' has ", (*s)[0], " rows",
                         (*s)[0] % (mult * heads) == 0 ? str(" (head_dim ", (*s)[0] / (mult * heads), "?)") : std::string()));
  }
  if (c.is_mla()) check_mla_sizes(c, ckpt);
  // Experts: the router rows of the first MoE layer.
  for (int64_t i = 0; i < c.num_layers && c.num_experts > 0; ++i) {
    if (!c.is_moe_layer(i)) continue;
    const std::string p = layer_prefix(i);
    const std::string router = c.moe_kind == MoeKind::topk_softmax_clamped ? p + "mlp.router.weight" : tensor_source(c, ckpt, p + "mlp.gate.weight", {}).keys[0].first;
    if (const auto* s = matrix(c, ckpt, router); s && (*s)[0] != c.num_experts)
      throw UsageError(str(c.source, ": '", family_of(c).experts_key,
                           "' is ", c.num_experts, " but ", ckpt.file_of(router), ": tensor '", router, "' (the router) has ",
                           (*s)[0], " rows"));
    break;
  }
}

void check_checkpoint(const HfConfig& c, const safetensors::Checkpoint& ckpt) {
  check_checkpoint_sizes(c, ckpt);
  for (const auto& [name, shape] : internal_tensors(c)) {
    const TensorSource s = tensor_source(c, ckpt, name, shape);
    if (s.mxfp4) {
      if (!c.mxfp4_experts)
        throw UsageError(str(ckpt.source(), ": tensor '", name, "' is stored as MXFP4 blocks/scales but ", c.source,
                             " has no quantization_config with quant_method mxfp4"));
      check_gpt_oss_mxfp4(ckpt, name, shape, c.source);
      continue;
    }
    if (s.bnb) {  // the logical shape from each quant state (a few bytes of JSON), the packed fields by name
      for (const auto& [key, key_shape] : s.keys) check_bnb_weight(ckpt, key, key_shape);
      continue;
    }
    for (const auto& [key, key_shape] : s.keys) check_tensor_header(c, ckpt, key, key_shape);
  }
}

WeightPlan weight_plan(const HfConfig& c, const WeightPolicy& policy) {
  std::vector<std::string> modules;
  for (const auto& [name, shape] : internal_tensors(c))
    if (is_projection(name)) modules.push_back(module_path(name));
  WeightPlan plan(policy, modules);
  // A bitsandbytes 4-bit checkpoint (docs/weights.md, "Pre-quantised checkpoints") is taken as it is stored:
  // its packed projections stay nf4 whatever the policy, and nothing else is packed at load.
  if (c.quant.present) check_prequantised_policy(policy, c.quant, c.source);
  if (plan.format() == ops::WeightFormat::fp8 && !c.fp8.present)
    throw UsageError(str("model.weight_format = \"fp8\" keeps a fine-grained FP8 checkpoint's weights as stored, but ",
                         c.source, " has no quantization_config with quant_method fp8 (nothing quantises to fp8 at load: "
                         "use nf4, mxfp4 or nvfp4 for QLoRA of this model)"));
  return plan;
}

std::string fp8_kept_why(const HfConfig& c, const safetensors::Checkpoint& ckpt, const WeightPlan& plan, const std::string& name,
                         const TensorSource& s) {
  if (name == "lm_head.weight") return "lm_head stays in the compute dtype";
  for (const auto& entry : plan.policy().skip_modules)
    if (skip_entry_matches(module_path(name), entry)) return str("skip_modules '", entry, "', dequantised");
  const int64_t per = s.per_expert ? static_cast<int64_t>(s.keys.size()) / c.num_experts : 1;
  return fp8_unpackable(c.fp8, ckpt, s.keys, per);
}

std::map<std::string, ops::WeightFormat> held_formats(const HfConfig& c, const WeightPlan& plan,
                                                      const safetensors::Checkpoint& ckpt) {
  std::map<std::string, ops::WeightFormat> out;
  out["lm_head.weight"] = ops::WeightFormat::dense;  // by policy; the embeddings when tied; dequantised when packed
  for (const auto& [name, shape] : internal_tensors(c)) {
    if (!is_projection(name) || name == "lm_head.weight") continue;
    const TensorSource s = tensor_source(c, ckpt, name, shape);
    if (s.bnb || s.mxfp4) {  // as stored, unless skip_modules keeps it dense (dequantised at load)
      bool skip = false;
      for (const auto& entry : plan.policy().skip_modules) skip = skip || skip_entry_matches(module_path(name), entry);
      out[name] = skip ? ops::WeightFormat::dense : s.mxfp4 ? ops::WeightFormat::mxfp4 : ops::WeightFormat::nf4;
      continue;
    }
    if (plan.format() == ops::WeightFormat::fp8) {  // an FP8 checkpoint's projections as stored, where they can be
      out[name] = fp8_kept_why(c, ckpt, plan, name, s).empty() ? ops::WeightFormat::fp8 : ops::WeightFormat::dense;
      continue;
    }
    // Stored dense: packed at load where the plan admits it; a pre-quantised checkpoint packs nothing more.
    std::string why;
    plan.spec_for(name, shape, why);
    out[name] = why.empty() && !c.quant.present ? plan.format() : ops::WeightFormat::dense;
  }
  return out;
}

}  // namespace ax::models
