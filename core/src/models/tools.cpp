// The model-directory tools behind `axengine init-model`, `inspect` and `merge-lora`.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "atomic_dir.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/bnb_load.hpp"
#include "models/decoder.hpp"
#include "models/family.hpp"
#include "models/fp8_load.hpp"
#include "models/layer_bytes.hpp"
#include "models/lora_all_linear.hpp"
#include "models/composite.hpp"
#include "models/vision_lora.hpp"
#include "models/vlm.hpp"
#include "models/tied_head.hpp"
#include "models/training_record.hpp"
#include "models/weight_policy.hpp"

namespace ax {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Tiny but complete configs, in the form transformers 5 writes (rope_parameters, dtype).
json preset_config(const std::string& name, int64_t vocab, int64_t bos, int64_t eos, int64_t pad) {
  json c = {{"vocab_size", vocab}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"max_position_embeddings", 2048}, {"initializer_range", 0.02},
            {"hidden_act", "silu"}, {"dtype", "float32"}, {"use_cache", true}, {"attention_dropout", 0.0},
            {"bos_token_id", bos >= 0 ? json(bos) : json(nullptr)}, {"eos_token_id", eos}, {"pad_token_id", pad}};
  // The family's preset (models/families/<name>.cpp).
  for (const models::Family* f : models::families())
    for (const auto& p : f->presets)
      if (p.name == name) {
        p.apply(c);
        return c;
      }
  std::string hint = closest(name, model_presets());
  throw UsageError(str("unknown preset '", name, "' (presets: ", join(model_presets(), ", "), ")",
                       hint.empty() ? "" : str("; did you mean '", hint, "'?")));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string human(int64_t n) {
  std::ostringstream os;
  os.precision(3);
  if (n >= 1000000000) os << double(n) / 1e9 << "B";
  else if (n >= 1000000) os << double(n) / 1e6 << "M";
  else if (n >= 1000) os << double(n) / 1e3 << "K";
  else os << n;
  return os.str();
}

}  // namespace

std::vector<std::string> model_presets() {
  std::vector<std::string> out;
  for (const models::Family* f : models::families())
    for (const auto& p : f->presets) out.push_back(p.name);
  for (const models::VlDescription* d : models::vl_descriptions()) out.push_back(d->preset);
  return out;
}

void init_model_dir(const std::string& preset, const std::string& out_dir, uint64_t seed) {
  // A vision-language model: its config, tower and tokenizer are of another shape (its family's writer).
  for (const models::VlDescription* d : models::vl_descriptions())
    if (preset == d->preset) return d->init_preset(out_dir, seed);
  ByteLevelTokenizerOptions tok;
  tok.corpus = {"the quick brown fox jumps over the lazy dog", "hello world, hello axengine",
                "fine-tuning language models with LoRA adapters", "0123456789 numbers and  spaces\n"};
  tok.num_merges = 40;
  const std::string tok_json = make_byte_level_tokenizer_json(tok);
  auto tokenizer = parse_hf_tokenizer(tok_json, "generated tokenizer.json", make_byte_level_tokenizer_config_json(tok));
  // Round the vocabulary up to a multiple of 64, as real checkpoints pad their embedding tables.
  const int64_t vocab = (tokenizer->vocab_size() + 63) / 64 * 64;
  json cfg = preset_config(preset, vocab, tokenizer->bos_id(), tokenizer->eos_id(), tokenizer->pad_id());
  models::HfConfig hc = models::parse_hf_config(cfg, preset);

  if (fs::exists(out_dir) && !fs::is_empty(out_dir))
    throw UsageError(str(out_dir, ": output directory exists and is not empty"));
  AtomicDir out(out_dir, "init_model");  // appears whole or not at all
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, shape] : models::expected_checkpoint_tensors(hc)) {
    at::Tensor t = at::empty(shape, at::kFloat);
    // HF's _init_weights: normal(0, initializer_range) for linears / embeddings / routers, ones for norms
    // (zeros for gemma3_text's (1 + w) norms: the same unit scale).
    // The Gated DeltaNet's gated norm scales by w, not 1 + w; its decay as Qwen3_5PreTrainedModel._init_weights
    // sets it: dt_bias ones, A_log = log(A) with A uniform in [0.01, 16).
    if (name.find("linear_attn.norm.") != std::string::npos || name.find("linear_attn.dt_bias") != std::string::npos) t.fill_(1.0);
    else if (name.find("linear_attn.A_log") != std::string::npos) t.uniform_(0.01, 16.0, gen).log_();
    else if (name.find("norm") != std::string::npos) t.fill_(hc.norm_offset ? 0.0 : 1.0);
    // Except the (tied) embeddings: at std 0.02 and hidden 64 an output logit can never exceed |h|·|e| ≈ 1.3, so
    // a LoRA adapter on the frozen random base could not fall below ~4.5 nats/token. Unit-norm rows
    // (std 1/sqrt(hidden)) keep the initial logits O(1) and let training show (the quickstart trains these).
    else if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
      t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(hc.hidden_size)), gen);
    else if ((name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) ||
             name.find(".e_score_correction_bias") != std::string::npos)  // the group router's buffer: zeros
      t.zero_();
    else t.normal_(0.0, 0.02, gen);
    tensors.emplace_back(name, t);
  }
  const fs::path d(out.path());
  const char* w = "init_model";
  safetensors::save((d / "model.safetensors").string(), tensors, {{"format", "pt"}}, w);
  safetensors::write_file_atomic((d / "config.json").string(), cfg.dump(2) + "\n", w);
  json gen_cfg = {{"bos_token_id", cfg["bos_token_id"]}, {"eos_token_id", cfg["eos_token_id"]},
                  {"pad_token_id", cfg["pad_token_id"]}, {"_from_model_config", true}};
  safetensors::write_file_atomic((d / "generation_config.json").string(), gen_cfg.dump(2) + "\n", w);
  safetensors::write_file_atomic((d / "tokenizer.json").string(), tok_json, w);
  safetensors::write_file_atomic((d / "tokenizer_config.json").string(), make_byte_level_tokenizer_config_json(tok), w);
  out.commit();
  log::info(str("wrote ", preset, " (", hc.model_type, ", vocab ", hc.vocab_size, ") to ", out_dir));
}

std::string inspect_model_dir(const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const json cfg_json = models::read_json_file(cfg_path);
  // A vision-language model (models/vlm.hpp): its language model is a decoder of the built-in families; the
  // vision side's tensors are listed beside it, everything under the names it loads by.
  const models::VlDescription* vld = cfg_json.is_object() ? models::find_vl_description(cfg_json.value("model_type", "")) : nullptr;
  std::optional<models::VlInspect> vl;
  if (vld) vl = vld->inspect(cfg_json, cfg_path);
  models::HfConfig c = vl ? vl->text : models::parse_hf_config(cfg_json, cfg_path);
  // The tensors as stored (listed), and under the names they load by (what the checks below read).
  const auto stored = vld ? safetensors::Checkpoint::open_dir(dir)
                          : models::checkpoint_text_view(c, safetensors::Checkpoint::open_dir(dir));  // a multimodal one's text part
  const auto ckpt = vld ? models::vl_view(*vld, stored) : stored;
  auto loaded_name = [vld](const std::string& n) -> std::string {
    if (!vld) return n;
    if (auto t = vld->text_name(n)) return *t;
    return vld->vision_name(n).value_or(n);
  };
  // The sizes every list below is made of, against the checkpoint first: a config claiming 10^9 layers is
  // refused here, not listed.
  models::check_checkpoint_sizes(c, ckpt);
  if (vl && vl->check_sizes) vl->check_sizes(ckpt);
  // A stored head that differs from the embeddings is what a load uses (models/tied_head.hpp).
  const bool untied = models::stored_head_differs(c, ckpt, "model.embed_tokens.weight");
  if (untied) c.tie_word_embeddings = false;
  std::ostringstream os;
  os << "model dir      " << dir << "\n";
  os << "architecture   " << (vl ? vl->architecture : c.model_type) << ": " << c.num_layers << " layers, hidden " << c.hidden_size << ", heads "
     << c.num_heads << " (kv " << c.num_kv_heads << ", head_dim " << c.head_dim << "), vocab " << c.vocab_size << "\n";
  os << "               rope " << c.rope.type << " theta " << c.rope.theta;
  if (c.rope.type != "default") os << " factor " << c.rope.factor;
  if (c.rope_dim() < c.head_dim) os << " on " << c.rope_dim() << " of head_dim " << c.head_dim;  // partial RoPE
  if (c.has_local_rope) {  // gemma3_text: the sliding layers' own RoPE
    os << " (sliding layers: " << c.rope_local.type << " theta " << c.rope_local.theta;
    if (c.rope_local.type != "default") os << " factor " << c.rope_local.factor;
    os << ")";
  }
  os << ", rms_norm_eps " << c.rms_norm_eps << (c.tie_word_embeddings ? ", tied embeddings" : "")
     << (untied ? ", untied head: tie_word_embeddings is true but the checkpoint's own lm_head.weight differs from the "
                  "embeddings, so it is used (as transformers does)"
                : "")
     << (c.qk_norm ? ", q/k norm" : "") << (c.qk_norm_full ? ", q/k norm over all heads" : "")
     << (c.clip_qkv > 0 ? str(", clip_qkv ", c.clip_qkv) : "") << (c.norm_offset ? ", (1 + w) norms" : "")
     << (c.sandwich_norms ? ", sandwich norms" : "")
     << (c.qkv_bias ? (c.o_bias ? ", attention bias" : ", q/k/v bias") : "")
     << (c.mlp_bias ? ", MLP bias" : "");
  int64_t sliding = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) sliding += c.window(i) > 0;
  if (sliding > 0) {
    int64_t w = 0;
    for (int64_t i = 0; i < c.num_layers && !w; ++i) w = std::max<int64_t>(c.window(i), 0);
    os << ", sliding window " << w << " on " << sliding << "/" << c.num_layers << " layers";
  }
  os << "\n";
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) moe_layers += c.is_moe_layer(i);
  if (c.num_experts > 0)
    os << "               MoE: " << c.num_experts << " experts, top-" << c.top_k << ", expert intermediate "
       << c.moe_intermediate_size << ", " << moe_layers << "/" << c.num_layers << " layers sparse, "
       << (c.moe_kind == models::MoeKind::topk_softmax_clamped ? std::string("softmax over the top-k logits, attention sinks")
                          : std::string("norm_topk_prob ") + (c.norm_topk_prob ? "on" : "off"))
       << (c.moe_kind == models::MoeKind::group_topk_sigmoid
               ? str(", sigmoid router with correction bias, ", c.n_group, " groups keep ", c.topk_group, ", routed scaling ",
                     c.routed_scaling_factor, ", no aux loss")
               : str(", aux loss coef ", c.router_aux_loss_coef))
       << (c.shared_expert_intermediate_size > 0 ? str(", shared experts ", c.shared_expert_intermediate_size) : std::string())
       << "\n";
  else
    os << "               dense MLP, intermediate " << c.intermediate_size << "\n";
  if (c.is_mla())  // deepseek_v3: head_dim above is the rope dims
    os << "               multi-head latent attention: q " << (c.mla.q_lora_rank > 0 ? str("LoRA rank ", c.mla.q_lora_rank) : "q_proj")
       << ", kv_lora_rank " << c.mla.kv_lora_rank << ", qk " << c.mla.qk_nope_head_dim << " + rope " << c.mla.qk_rope_head_dim
       << ", v " << c.mla.v_head_dim << ", softmax scale " << c.mla.softmax_scale << "\n";

  if (vl) os << "               vision tower: " << vl->tower << "\n";

  // Parameter counts from the config (what the model holds), checked against the checkpoint below.
  int64_t total = 0;
  for (const auto& [n, s] : models::expected_checkpoint_tensors(c)) total += numel(s);
  std::set<std::string> expected;
  if (vl)
    for (const auto& [n, s] : vl->vision) {
      total += numel(s);
      expected.insert(n);
    }
  const int64_t per_expert = 3 * c.moe_intermediate_size * c.hidden_size;
  const int64_t active = total - moe_layers * (c.num_experts - c.top_k) * per_expert;
  os << "parameters     " << human(total) << " total (" << total << "), " << human(active) << " active per token ("
     << active << ")\n";
  os << models::moe_layer_bytes_line(c);  // one sparse layer's bytes by expert format (models/layer_bytes.hpp)

  for (const auto& [n, s] : models::expected_checkpoint_tensors(c)) expected.insert(n);
  // A bitsandbytes 4-bit checkpoint: its packed weights (with their quant-state fields) and how they are packed.
  std::map<std::string, models::BnbQuantState> packed;
  if (c.quant.present) {
    int64_t linears = 0, packed_linears = 0;
    std::set<int64_t> blocksizes;
    int64_t nested = 0;
    std::vector<std::string> unpacked;
    for (const auto& [n, s] : models::expected_checkpoint_tensors(c)) {
      const bool linear = models::is_projection(n) || (n.find(".experts.") != std::string::npos && n.size() > 7 &&
                                                       n.compare(n.size() - 7, 7, ".weight") == 0);
      if (!models::bnb_packed(ckpt, n)) {
        if (linear) unpacked.push_back(models::module_path(n));
        linears += linear;
        continue;
      }
      const auto st = models::read_bnb_quant_state(ckpt, n);
      packed[n] = st;
      linears += linear;
      packed_linears += linear;
      blocksizes.insert(st.blocksize);
      nested += st.nested;
      for (const auto& f : models::bnb_field_keys(ckpt, n)) expected.insert(f);
    }
    std::vector<std::string> bs;
    for (auto b : blocksizes) bs.push_back(std::to_string(b));
    const int64_t np = static_cast<int64_t>(packed.size());
    os << "weights        nf4 (bitsandbytes, "
       << (nested == 0 ? "" : nested == np ? "double quant, " : str("double quant on ", nested, " of ", np, ", "))
       << "blocksize " << join(bs, "/") << "), pre-quantised: " << packed_linears << " of " << linears
       << " projections packed";
    if (np > packed_linears) os << ", " << np - packed_linears << " other tensors (dequantised at load)";
    if (!unpacked.empty()) {
      const std::size_t shown = std::min<std::size_t>(unpacked.size(), 8);
      os << "; stored unpacked: " << join(std::vector<std::string>(unpacked.begin(), unpacked.begin() + shown), ", ")
         << (unpacked.size() > shown ? str(" and ", unpacked.size() - shown, " more") : "");
    }
    os << "\n";
  }
  if (c.fp8.present) {  // fine-grained FP8 (models/fp8_load.hpp): the weights with a scale, and the scales
    int64_t fp8 = 0, params = 0, bytes = 0;  // bytes as stored: the e4m3 weights and their scales
    for (const auto& [n, s] : models::expected_checkpoint_tensors(c))
      if (ckpt.has(n) && models::fp8_stored(ckpt, n)) {
        ++fp8;
        const std::string sk = models::fp8_scale_key(n);
        expected.insert(sk);
        int64_t numel = 1, scales = 1;
        for (auto d : ckpt.info(n).shape) numel *= d;
        if (ckpt.has(sk))
          for (auto d : ckpt.info(sk).shape) scales *= d;
        params += numel;
        bytes += numel + scales * 4;  // fp32 scales as held (a bf16 scale widens exactly)
      }
    char bpp[32];
    std::snprintf(bpp, sizeof bpp, "%.4f", params ? double(bytes) / double(params) : 0.0);
    os << "weights        fp8 e4m3, blocks " << c.fp8.block_rows << " x " << c.fp8.block_cols << ": " << fp8
       << " tensors with their weight_scale_inv, dequantised at load (model.weight_format = \"fp8\" keeps them: "
       << params << " parameters at " << bpp << " bytes/param incl. scales)\n";
  }
  os << "tensors        " << stored.names().size() << " in " << stored.source() << "\n";
  for (const auto& n : stored.names()) {
    const auto& t = stored.info(n);
    auto p = packed.find(loaded_name(n));
    os << "  " << n << "  " << t.dtype << " " << shape_str(t.shape)
       << (p != packed.end() ? "  nf4 " + shape_str(p->second.shape) : "") << (expected.count(loaded_name(n)) ? "" : "  (not used)") << "\n";
  }

  os << "LoRA targets   (name: modules it matches)\n";
  auto list_sites = [&os](const std::vector<models::LoraSite>& sites) {
    std::map<std::string, std::pair<int64_t, std::string>> by_leaf;
    for (const auto& s : sites) {
      auto& e = by_leaf[s.leaf + (s.experts ? " (experts)" : "")];
      if (e.first++ == 0) e.second = s.path;
    }
    for (const auto& [leaf, e] : by_leaf) os << "  " << leaf << ": " << e.first << " (e.g. " << e.second << ")\n";
  };
  list_sites(models::lora_sites(c));
  // peft's "all-linear" on this model (models/lora_all_linear.hpp). A vision-language model's LoRA is planned under
  // its description's LoRA family, whose targets peft converts for no expert on qwen3_vl_moe (models/qwen3_vl_moe.cpp).
  const std::string lora_type = vld ? vld->lora_family : c.model_type;
  const models::AllLinear all = models::resolve_all_linear(lora_type, vl ? models::vl_lora_sites(c) : models::lora_sites(c));
  os << "  \"all-linear\": " << join(all.targets, ", ");
  if (!all.not_supported.empty())
    os << "; refused: peft also targets " << all.not_supported.front()
       << (all.not_supported.size() > 1 ? str(" and ", all.not_supported.size() - 1, " more") : "")
       << ", which axengine puts no LoRA on";
  os << "\n";
  // The vision side's sites, which lora.vision_targets name (models/vision_lora.hpp).
  if (vl) {
    const auto vision = models::vision_lora_sites(*vl);
    if (vision.empty()) os << "LoRA vision_targets: none (LoRA on the " << vld->vision_what << " is not implemented for " << vld->family << ")\n";
    else os << "LoRA vision_targets (name: modules it matches; peft's path model.<module>)\n";
    list_sites(vision);
  }
  if (const auto& n = models::family_of(c).per_expert; c.num_experts > 0 && n && lora_type == c.model_type)
    os << "  note: on this MoE model " << n->gate << "+" << n->up << " / " << n->down
       << " target the fused experts (as peft does for transformers 5): one rank-2r LoRA on gate_up_proj, "
          "and dense MLP layers get none\n";
  else if (c.num_experts > 0 && lora_type != c.model_type)
    os << "  note: peft converts no target on this model: gate_up_proj / experts.down_proj target the fused experts "
          "(peft's target_parameters), gate_proj / up_proj / down_proj the dense MLP layers only\n";
  return os.str();
}

void merge_lora_dir(const Registry& registry, const std::string& model_dir_arg, const std::string& adapter_dir,
                    const std::string& out_dir, const std::string& dtype, const std::optional<WeightPolicy>& weights) {
  if (fs::exists(out_dir) && !fs::is_empty(out_dir))
    throw UsageError(str(out_dir, ": output directory exists and is not empty"));
  // The base the adapter learned against, from its training record (models/training_record.hpp).
  const models::MergePlan plan = models::plan_merge(model_dir_arg, adapter_dir, weights);
  const std::string& model_dir = plan.model_dir;
  ModelLoadOptions o;
  o.dir = model_dir;
  o.dtype = "fp32";  // merge in fp32, cast once at the end
  o.adapter_dir = adapter_dir;
  o.weights = plan.weights;
  o.kernels = std::make_shared<KernelSet>(registry, KernelPreferences{}, DeviceInfo{});
  auto model = load_model(registry, o);
  const std::string base_format = model->weight_stats().format;
  models::check_trained_base(plan.record, adapter_dir, model_dir, base_format, "merge-lora");
  auto* dm = dynamic_cast<models::DecoderModel*>(model.get());
  auto* composite = dynamic_cast<models::CompositeModel*>(model.get());  // a language model beside a vision tower...
  if (!dm && !composite)
    throw UsageError(str(model_dir, ": merge-lora supports the decoder families and the composite ones (models/composite.hpp) only"));

  at::ScalarType out_dtype = models::checkpoint_dtype(model_dir);  // as the base checkpoint by default
  if (!dtype.empty()) {
    auto d = ops::parse_dtype(dtype);
    if (!d || *d == at::kDouble) throw UsageError(str("merge-lora: dtype must be fp32, bf16 or fp16, got '", dtype, "'"));
    out_dtype = *d;
  }
  AtomicDir out(out_dir, "merged_model");  // appears whole or not at all
  const fs::path d(out.path());
  const char* w = "merged_model";
  if (dm) models::write_model_dir(*dm, model_dir, out.path(), out_dtype);
  else models::write_composite_model_dir(composite->language_model(), composite->checkpoint_layout(model_dir), model_dir, out.path(), out_dtype);
  json cfg = models::read_json_file((d / "config.json").string());
  safetensors::write_file_atomic((d / models::kMergeRecordFile).string(),
                                 models::merge_record_json(plan, adapter_dir, base_format, cfg["dtype"].get<std::string>()), w);
  out.commit();
  log::info(str("merged ", adapter_dir, " into ", model_dir, base_format == "dense" ? "" : " (" + base_format + " base, dequantised)",
                " -> ", out_dir));
}

}  // namespace ax
