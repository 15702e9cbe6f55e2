// Qwen3VLConfig as transformers 5.23 reads it (configuration_qwen3_vl.py): text_config (Qwen3VLTextConfig, a
// qwen3 decoder whose rope_parameters carry mrope_section) and vision_config (Qwen3VLVisionConfig), each key
// that is left out taking the class's default. Only the top-level tie_word_embeddings decides the head (the
// model's config is the top-level one).
#include <cmath>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/config_reader.hpp"
#include "models/qwen3_vl.hpp"

namespace ax::models {

using json = nlohmann::json;

int64_t Qwen3VisionConfig::grid_side() const {
  return static_cast<int64_t>(std::sqrt(static_cast<double>(num_position_embeddings)));
}

std::vector<int64_t> interleaved_sections(const std::vector<int64_t>& section, int64_t half_dim) {
  std::vector<int64_t> out;
  for (int64_t j = 0; j < half_dim; ++j) {
    const int64_t axis = (j % 3 == 1 && j < 3 * section[1]) ? 1 : (j % 3 == 2 && j < 3 * section[2]) ? 2 : 0;
    if (!out.empty() && static_cast<int64_t>(out.size() - 1) % 3 == axis) {
      ++out.back();  // the running section already takes this axis
      continue;
    }
    while (static_cast<int64_t>(out.size()) % 3 != axis) out.push_back(0);
    out.push_back(1);
  }
  return out;
}

namespace {

Qwen3VisionConfig parse_vision(const json& vj, const std::string& source) {
  const std::string where = source + " (vision_config)";
  if (!vj.is_object()) throw UsageError(str(source, ": 'vision_config' must be an object"));
  Reader r{vj, where};
  Qwen3VisionConfig v;
  auto positive_or = [&](const char* k, int64_t def) {
    const int64_t x = r.has(k) ? r.positive(k) : def;
    // Bounds that keep every size below in int64 and the model something a machine could hold.
    if (x > (int64_t(1) << 20)) throw r.bad(k, str("is too large (", x, ")"));
    return x;
  };
  v.depth = positive_or("depth", v.depth);
  v.hidden_size = positive_or("hidden_size", v.hidden_size);
  v.intermediate_size = positive_or("intermediate_size", v.intermediate_size);
  v.num_heads = positive_or("num_heads", v.num_heads);
  v.out_hidden_size = positive_or("out_hidden_size", v.out_hidden_size);
  v.in_channels = positive_or("in_channels", v.in_channels);
  v.patch_size = positive_or("patch_size", v.patch_size);
  v.temporal_patch_size = positive_or("temporal_patch_size", v.temporal_patch_size);
  v.spatial_merge_size = positive_or("spatial_merge_size", v.spatial_merge_size);
  v.num_position_embeddings = positive_or("num_position_embeddings", v.num_position_embeddings);
  if (r.has("deepstack_visual_indexes")) {
    const json& d = vj["deepstack_visual_indexes"];
    if (!d.is_array()) throw r.bad("deepstack_visual_indexes", str("must be a list of block indexes, got ", d.dump()));
    v.deepstack_visual_indexes.clear();
    for (const auto& e : d) {
      if (!e.is_number_integer()) throw r.bad("deepstack_visual_indexes", str("must be a list of block indexes, got ", d.dump()));
      v.deepstack_visual_indexes.push_back(e.get<int64_t>());
    }
  }
  for (std::size_t a = 0; a < v.deepstack_visual_indexes.size(); ++a) {
    const int64_t i = v.deepstack_visual_indexes[a];
    if (i < 0 || i >= v.depth) throw r.bad("deepstack_visual_indexes", str("holds ", i, ", not a block index in [0, ", v.depth, ")"));
    for (std::size_t b = 0; b < a; ++b)
      if (v.deepstack_visual_indexes[b] == i) throw r.bad("deepstack_visual_indexes", str("holds ", i, " twice"));
  }
  v.hidden_act = r.string_or("hidden_act", v.hidden_act);
  if (v.hidden_act != "gelu_pytorch_tanh" && v.hidden_act != "gelu")
    throw r.bad("hidden_act", str("must be \"gelu_pytorch_tanh\" or \"gelu\", got \"", v.hidden_act, "\""));
  if (v.hidden_size % v.num_heads != 0)
    throw r.bad("hidden_size", str(v.hidden_size, " is not a multiple of num_heads ", v.num_heads));
  // The 2-D rotary gives head_dim/4 frequencies to each of the h and w axes.
  if (v.head_dim() % 4 != 0) throw r.bad("hidden_size", str("gives head_dim ", v.head_dim(), ", not a multiple of 4 (2-D rotary)"));
  if (v.grid_side() < 1) throw r.bad("num_position_embeddings", "must be at least 1");
  if (r.has("rope_parameters")) {
    const json& rp = vj["rope_parameters"];
    if (!rp.is_object()) throw r.bad("rope_parameters", "must be an object");
    Reader rr{rp, where + " rope_parameters"};
    if (rr.string_or("rope_type", "axial") != "axial") throw rr.bad("rope_type", str("must be \"axial\", got ", rp["rope_type"].dump()));
    v.rope_theta = rr.number_or("rope_theta", v.rope_theta);
    if (!(v.rope_theta > 0) || !std::isfinite(v.rope_theta)) throw rr.bad("rope_theta", "must be a finite number > 0");
  }
  return v;
}

}  // namespace

const Qwen3VlTextClass& qwen3_vl_text_class() {
  // Qwen3VLTextConfig's defaults (not Qwen3Config's: rope_theta 500000, max_position_embeddings 128000).
  static const Qwen3VlTextClass cls{"qwen3_vl", "qwen3",
                                    {{"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 22016},
                                     {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 32},
                                     {"head_dim", 128}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 128000},
                                     {"rope_theta", 500000.0}, {"attention_bias", false}, {"hidden_act", "silu"}}};
  return cls;
}

Qwen3VlConfig parse_qwen3_vl_config(const json& j, const std::string& source) {
  return parse_qwen3_vl_config(j, source, qwen3_vl_text_class());
}

Qwen3VlConfig parse_qwen3_vl_config(const json& j, const std::string& source, const Qwen3VlTextClass& cls) {
  if (!j.is_object()) throw UsageError(str(source, ": not a JSON object"));
  Qwen3VlConfig c;
  c.source = source;
  Reader top{j, source};
  if (top.string_or("model_type", "") != cls.model_type)
    throw top.bad("model_type", str("must be \"", cls.model_type, "\", got ", j.value("model_type", json()).dump()));
  c.vision = parse_vision(top.has("vision_config") ? j["vision_config"] : json::object(), source);
  auto token = [&](const char* k, int64_t def) {
    if (!top.has(k)) return def;
    if (!j[k].is_number_integer() || j[k].get<int64_t>() < 0) throw top.bad(k, str("must be a token id, got ", j[k].dump()));
    return j[k].get<int64_t>();
  };
  c.image_token_id = token("image_token_id", c.image_token_id);
  c.video_token_id = token("video_token_id", c.video_token_id);
  c.vision_start_token_id = token("vision_start_token_id", c.vision_start_token_id);
  c.vision_end_token_id = token("vision_end_token_id", c.vision_end_token_id);

  // The language model: a decoder of cls.decoder_type read by parse_hf_config, with the text config class's
  // defaults for what text_config leaves out. A null num_key_value_heads is num_attention_heads (the class's
  // __post_init__); a null default is one the class derives (parse_hf_config derives it alike).
  if (top.has("text_config") && !j["text_config"].is_object()) throw top.bad("text_config", "must be an object");
  json t = top.has("text_config") ? j["text_config"] : json::object();
  const std::string text_source = source + " (text_config)";
  for (const auto& [key, value] : cls.defaults.items()) {
    if (key == "num_key_value_heads" && t.contains(key) && t[key].is_null()) continue;
    if (!t.contains(key) || t[key].is_null()) t[key] = value;
    if (t[key].is_null()) t.erase(key);
  }
  if (t.contains("num_key_value_heads") && t["num_key_value_heads"].is_null()) t["num_key_value_heads"] = t["num_attention_heads"];
  t["tie_word_embeddings"] = top.boolean_or("tie_word_embeddings", false);
  t["model_type"] = cls.decoder_type;
  // mrope_section (default [24, 20, 20]) and mrope_interleaved sit in the rope dict. transformers 5.23 always
  // interleaves (Qwen3VLTextRotaryEmbedding ignores the flag): false would mean a layout it never runs.
  std::vector<int64_t> section{24, 20, 20};
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!t.contains(key) || !t[key].is_object()) continue;
    json& rp = t[key];
    Reader rr{rp, text_source + " " + key};
    if (rr.has("mrope_section")) {
      if (!rp["mrope_section"].is_array()) throw rr.bad("mrope_section", "must be a list of three integers");
      section.clear();
      for (const auto& e : rp["mrope_section"]) {
        if (!e.is_number_integer()) throw rr.bad("mrope_section", "must be a list of three integers");
        section.push_back(e.get<int64_t>());
      }
    }
    if (!rr.boolean_or("mrope_interleaved", true))
      throw rr.bad("mrope_interleaved", "false is not supported (transformers' Qwen3-VL interleaves the sections in any case)");
    rp.erase("mrope_section");
    rp.erase("mrope_interleaved");
    break;
  }
  c.text = parse_hf_config(t, text_source);
  c.text.model_type = cls.decoder_type;
  if (c.text.rope.type != "default")
    throw UsageError(str(text_source, ": rope type '", c.text.rope.type, "' is not supported with multimodal RoPE (only default)"));
  const int64_t half = c.text.head_dim / 2;
  int64_t sum = 0;
  for (int64_t s : section) {
    if (s <= 0 || s > half) throw UsageError(str(text_source, ": 'mrope_section' entries must be positive and at most head_dim / 2"));
    sum += s;
  }
  if (section.size() != 3 || sum != half)
    throw UsageError(str(text_source, ": 'mrope_section' must be three sizes summing to head_dim / 2 = ", half));
  c.mrope_section = section;
  c.text.mrope_section = interleaved_sections(section, half);
  if (c.vision.out_hidden_size != c.text.hidden_size)
    throw top.bad("vision_config.out_hidden_size", str("is ", c.vision.out_hidden_size, " but the language model's hidden_size is ", c.text.hidden_size));
  if (static_cast<int64_t>(c.vision.deepstack_visual_indexes.size()) > c.text.num_layers)
    throw top.bad("vision_config.deepstack_visual_indexes", str("holds ", c.vision.deepstack_visual_indexes.size(),
                                                                " blocks but the language model has ", c.text.num_layers, " layers"));
  for (int64_t id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id})
    if (id >= c.text.vocab_size) throw UsageError(str(source, ": the image token ids must be < vocab_size ", c.text.vocab_size));
  return c;
}

}  // namespace ax::models
