// Qwen2_5_VLConfig as transformers 5.23 reads it (configuration_qwen2_5_vl.py): the text keys either nested in
// text_config (what transformers 5 writes) or at the top level beside vision_config (transformers 4, the hub
// checkpoints); rope_scaling / rope_parameters carry mrope_section, and 4.x's rope type "mrope" means default.
#include <array>
#include <cmath>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/qwen2_5_vl.hpp"

namespace ax::models {

using json = nlohmann::json;

namespace {

struct Keys {
  const json& j;
  std::string where;  // "vision_config", ...: prefixes the key in messages
  const std::string& source;
  UsageError bad(const std::string& key, const std::string& msg) const {
    return UsageError(str(source, ": '", where.empty() ? key : where + "." + key, "' ", msg));
  }
  bool has(const std::string& k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t positive_or(const std::string& k, int64_t def) const {
    if (!has(k)) return def;
    if (!j[k].is_number_integer() || j[k].get<int64_t>() <= 0) throw bad(k, str("must be a positive integer, got ", j[k].dump()));
    return j[k].get<int64_t>();
  }
  int64_t token_or(const std::string& k, int64_t def) const {
    if (!has(k)) return def;
    if (!j[k].is_number_integer() || j[k].get<int64_t>() < 0) throw bad(k, str("must be a token id, got ", j[k].dump()));
    return j[k].get<int64_t>();
  }
  std::vector<int64_t> ints(const std::string& k, std::vector<int64_t> def) const {
    if (!has(k)) return def;
    if (!j[k].is_array()) throw bad(k, str("must be a list of integers, got ", j[k].dump()));
    std::vector<int64_t> out;
    for (const auto& v : j[k]) {
      if (!v.is_number_integer()) throw bad(k, str("must be a list of integers, got ", j[k].dump()));
      out.push_back(v.get<int64_t>());
    }
    return out;
  }
};

VisionConfig parse_vision(const json& vj, const std::string& source) {
  if (!vj.is_object()) throw UsageError(str(source, ": 'vision_config' must be an object"));
  Keys k{vj, "vision_config", source};
  VisionConfig v;
  v.depth = k.positive_or("depth", v.depth);
  v.hidden_size = k.positive_or("hidden_size", v.hidden_size);
  v.intermediate_size = k.positive_or("intermediate_size", v.intermediate_size);
  v.num_heads = k.positive_or("num_heads", v.num_heads);
  v.out_hidden_size = k.positive_or("out_hidden_size", v.out_hidden_size);
  v.in_channels = k.positive_or("in_channels", v.in_channels);
  v.patch_size = k.positive_or("patch_size", v.patch_size);
  v.temporal_patch_size = k.positive_or("temporal_patch_size", v.temporal_patch_size);
  v.spatial_merge_size = k.positive_or("spatial_merge_size", v.spatial_merge_size);
  v.window_size = k.positive_or("window_size", v.window_size);
  v.fullatt_block_indexes = k.ints("fullatt_block_indexes", v.fullatt_block_indexes);
  // Bounds that keep every size below in int64 and the model something a machine could hold.
  for (auto [name, val] : {std::pair<const char*, int64_t>{"depth", v.depth}, {"hidden_size", v.hidden_size},
                           {"intermediate_size", v.intermediate_size}, {"out_hidden_size", v.out_hidden_size},
                           {"patch_size", v.patch_size}, {"in_channels", v.in_channels},
                           {"temporal_patch_size", v.temporal_patch_size}, {"spatial_merge_size", v.spatial_merge_size},
                           {"window_size", v.window_size}})
    if (val > (int64_t(1) << 20)) throw k.bad(name, str("is too large (", val, ")"));
  for (int64_t i : v.fullatt_block_indexes)
    if (i < 0 || i >= v.depth) throw k.bad("fullatt_block_indexes", str("holds ", i, ", not a block index in [0, ", v.depth, ")"));
  if (v.hidden_size % v.num_heads != 0)
    throw k.bad("hidden_size", str(v.hidden_size, " is not a multiple of num_heads ", v.num_heads));
  // The 2-D rotary splits head_dim/2 frequencies between the h and w axes: head_dim must be a multiple of 4.
  if (v.head_dim() % 4 != 0) throw k.bad("hidden_size", str("gives head_dim ", v.head_dim(), ", not a multiple of 4 (2-D rotary)"));
  const int64_t unit = v.spatial_merge_size * v.patch_size;
  if (v.window_size % unit != 0)
    throw k.bad("window_size", str(v.window_size, " is not a multiple of spatial_merge_size x patch_size = ", unit));
  if (k.has("hidden_act") && vj["hidden_act"] != "silu")
    throw k.bad("hidden_act", str("must be \"silu\" (the SwiGLU the vision MLP is built with), got ", vj["hidden_act"].dump()));
  if (k.has("rope_parameters")) {
    const json& rp = vj["rope_parameters"];
    if (!rp.is_object()) throw k.bad("rope_parameters", "must be an object");
    Keys r{rp, "vision_config.rope_parameters", source};
    if (r.has("rope_type") && rp["rope_type"] != "axial") throw r.bad("rope_type", str("must be \"axial\", got ", rp["rope_type"].dump()));
    if (r.has("rope_theta")) {
      if (!rp["rope_theta"].is_number() || !(rp["rope_theta"].get<double>() > 0) || !std::isfinite(rp["rope_theta"].get<double>()))
        throw r.bad("rope_theta", str("must be a finite number > 0, got ", rp["rope_theta"].dump()));
      v.rope_theta = rp["rope_theta"].get<double>();
    }
  }
  return v;
}

}  // namespace

VlConfig parse_qwen2_5_vl_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw UsageError(str(source, ": not a JSON object"));
  VlConfig c;
  c.source = source;
  Keys top{j, "", source};
  const std::string type = j.value("model_type", "");
  if (type == "qwen2_vl")
    throw UsageError(str(source, ": model_type 'qwen2_vl' (Qwen2-VL) is not supported: its vision tower (LayerNorm, "
                         "QuickGELU MLP, no window attention) differs from Qwen2.5-VL's; only 'qwen2_5_vl' loads"));
  if (type != "qwen2_5_vl") throw top.bad("model_type", str("must be \"qwen2_5_vl\", got ", j.value("model_type", json()).dump()));
  c.vision = parse_vision(top.has("vision_config") ? j["vision_config"] : json::object(), source);
  c.image_token_id = top.token_or("image_token_id", c.image_token_id);
  c.video_token_id = top.token_or("video_token_id", c.video_token_id);
  c.vision_start_token_id = top.token_or("vision_start_token_id", c.vision_start_token_id);
  c.vision_end_token_id = top.token_or("vision_end_token_id", c.vision_end_token_id);

  // The language model: a qwen2 decoder (q/k/v biases, Qwen2's sliding-window rules) read by parse_hf_config.
  json t;
  std::string text_source = source;
  if (top.has("text_config")) {
    if (!j["text_config"].is_object()) throw top.bad("text_config", "must be an object");
    t = j["text_config"];
    text_source = source + " (text_config)";
  } else {
    t = j;
    for (const char* k : {"vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"})
      t.erase(k);
  }
  // The top-level tie_word_embeddings decides (Qwen2_5_VLConfig ties when either says so).
  bool tie = false;
  for (const json* o : std::array<const json*, 2>{&j, &t})
    if (o->contains("tie_word_embeddings") && !(*o)["tie_word_embeddings"].is_null()) {
      if (!(*o)["tie_word_embeddings"].is_boolean()) throw top.bad("tie_word_embeddings", "must be true or false");
      tie = tie || (*o)["tie_word_embeddings"].get<bool>();
    }
  t["tie_word_embeddings"] = tie;
  t["model_type"] = "qwen2";
  // Read as a qwen2 config, but what it leaves out takes Qwen2_5_VLTextConfig's defaults, not Qwen2Config's
  // (tests/data/models/config_defaults.json). rope_theta also stands for a rope dict without one, as the
  // class's convert_rope_params_to_dict fills it.
  const int64_t kv_default = 8;
  if (!t.contains("num_key_value_heads") && t.contains("num_attention_heads") && t["num_attention_heads"].is_number_integer() &&
      t["num_attention_heads"].get<int64_t>() > 0 && t["num_attention_heads"].get<int64_t>() % kv_default != 0)
    throw UsageError(str(text_source, ": 'num_key_value_heads' is not given, and Qwen2_5_VLTextConfig's default ", kv_default,
                         " does not divide num_attention_heads ", t["num_attention_heads"].get<int64_t>()));
  for (const auto& [key, value] : {std::pair<const char*, json>{"rms_norm_eps", 1e-5}, {"rope_theta", 1e6},
                                   {"max_window_layers", 80}, {"num_key_value_heads", kv_default}})
    if (!t.contains(key)) t[key] = value;
  // mrope_section sits in the rope dict; transformers 4 named the type "mrope" (= default frequencies).
  std::vector<int64_t> section{16, 24, 24};  // Qwen2_5_VLRotaryEmbedding's default
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!t.contains(key) || t[key].is_null()) continue;
    json& rp = t[key];
    if (!rp.is_object()) break;  // parse_hf_config names it
    Keys r{rp, std::string(top.has("text_config") ? "text_config." : "") + key, source};
    section = r.ints("mrope_section", section);
    rp.erase("mrope_section");
    for (const char* tk : {"rope_type", "type"})
      if (rp.contains(tk) && rp[tk] == "mrope") rp[tk] = "default";
    break;
  }
  c.text = parse_hf_config(t, text_source);
  c.text.model_type = "qwen2";
  if (c.text.rope.type != "default")
    throw UsageError(str(text_source, ": rope type '", c.text.rope.type, "' is not supported with multimodal RoPE (only default)"));
  int64_t sum = 0;
  for (int64_t s : section) {
    if (s <= 0 || s > c.text.head_dim) throw UsageError(str(text_source, ": 'mrope_section' entries must be positive and at most head_dim"));
    sum += s;
  }
  if (section.size() != 3 || sum * 2 != c.text.head_dim)
    throw UsageError(str(text_source, ": 'mrope_section' must be three sizes summing to head_dim / 2 = ", c.text.head_dim / 2));
  c.text.mrope_section = section;
  if (c.vision.out_hidden_size != c.text.hidden_size)
    throw top.bad("vision_config.out_hidden_size", str("is ", c.vision.out_hidden_size, " but the language model's hidden_size is ", c.text.hidden_size));
  for (int64_t id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id})
    if (id >= c.text.vocab_size) throw UsageError(str(source, ": the image token ids must be < vocab_size ", c.text.vocab_size));
  return c;
}

}  // namespace ax::models
