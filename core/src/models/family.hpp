// A model family: what axengine knows of one transformers `model_type`, in one description
// (models/families/<name>.cpp). The decoder, the checkpoint map, LoRA, `init-model`, `inspect`, the registry and
// docs/models.md's family table read it from here; no other file tests a model_type string.
//
// Adding a family (docs/models.md, "Adding a family"): a file under families/ that defines `<name>_family()`,
// one line in family.cpp's list, its config defaults in scripts/goldens/make_config_defaults_goldens.py, a
// parity golden, and its row in docs/models.md's table (a test holds the table to the descriptions).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::models {

struct HfConfig;
struct Reader;  // models/config_reader.hpp

// What the family's transformers 5.23 config class takes for a key config.json leaves out, where families
// differ (tests/data/models/config_defaults.json holds the parser to it).
struct ClassDefaults {
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t num_kv_heads = 0;  // 0: num_attention_heads (the class derives it)
  int64_t head_dim = 0;      // 0: hidden_size / num_attention_heads (the modeling code derives it)
  bool tie_word_embeddings = false;
  // The RoPE the class builds when config.json has no rope key at all (gpt_oss: its YaRN); null: `rope_theta`.
  nlohmann::json rope_parameters;
  // > 0: the class reads partial_rotary_factor with this default (Qwen3.5: 0.25); 0: it must be 1.
  double partial_rotary_factor = 0.0;
};

// The per-expert checkpoint names of a MoE family whose experts we hold fused ([E, 2I, H] gate_up, [E, H, I]
// down): `<block>.experts.{e}.<gate|up|down>.weight` under `mlp.` (or `alt_block`, the hub layout of older
// checkpoints). The same three names are peft's _MOE_TARGET_MODULE_MAPPING entry: as LoRA targets, gate+up
// select the fused gate_up_proj and down the fused down_proj.
struct PerExpertNames {
  std::string gate, up, down;
  std::string alt_block;  // "" or e.g. "block_sparse_moe" (mixtral)
};

// An `init-model` preset: tiny but complete, in the form transformers 5 writes; `apply` adds the family's keys
// to the shared base (vocab, 64 hidden, 2 layers, 4 heads / 2 kv heads, token ids).
struct Preset {
  std::string name;
  void (*apply)(nlohmann::json& config);
};

struct Family {
  std::string name;          // model_type
  std::string config_class;  // transformers' config class, for messages about its defaults
  std::string summary;       // the registry's one line (`plugins list`)
  ClassDefaults defaults;
  // Keys the shared reader takes for this family (the others it refuses when set: the class builds no such
  // thing, so a checkpoint with it would silently lose it).
  bool reads_attention_bias = false, reads_mlp_bias = false;
  bool reads_hidden_act = true;  // gemma3_text's class ignores hidden_act (it reads hidden_activation)
  // MoE: the config key of the expert count in messages, the per-expert names (absent: fused only).
  bool moe = false;
  std::string experts_key = "num_experts";
  std::optional<PerExpertNames> per_expert;
  // The family's own keys, after the shared ones: windows, MoE keys, options and refusals.
  void (*read)(const Reader& r, HfConfig& c) = nullptr;
  std::vector<Preset> presets;
  // model_types that are not this family but are mistaken for it, with the refusal that points here
  // (gemma3: the multimodal Gemma3ForConditionalGeneration).
  std::vector<std::pair<std::string, std::string>> refused_types;
  // Other model_types this description reads (qwen3_5: "qwen3_5_text", what Qwen3_5ForCausalLM saves).
  std::vector<std::string> also_types;
  // A config.json with a `text_config` is the multimodal checkpoint of the family (qwen3_5): its language model
  // is read (HfConfig::text_part), the vision tower is not.
  bool reads_text_config = false;
};

// The built-in families, in docs/models.md's order.
const std::vector<const Family*>& families();
// nullptr when `model_type` is none of them.
const Family* find_family(const std::string& model_type);
// The family of a parsed config (it is always one of them).
const Family& family_of(const HfConfig& c);
// The refusal of a model_type some family names in refused_types; "" if none does.
std::string refused_type_message(const std::string& model_type);

}  // namespace ax::models
