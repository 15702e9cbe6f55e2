#include "models/hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {
using nlohmann::json;

namespace {

// Upper bounds on the sizes, checked before anything is sized by them (per-layer tables here, the tensor lists
// of the checkpoint check): every shape product stays inside int64, and no per-layer loop runs 10^9 times.
// The exact sizes are then checked against the checkpoint's tensors (models/decoder_checkpoint.hpp).
void check_size_bounds(const HfConfig& c, const Reader& r) {
  constexpr int64_t kMaxLayers = int64_t(1) << 16, kMaxDim = (int64_t(1) << 31) - 1;
  if (c.num_layers > kMaxLayers)
    throw r.bad("num_hidden_layers", str("is ", c.num_layers, ", more than ", kMaxLayers, " (no checkpoint has that many layers)"));
  for (const auto& [key, v] : {std::pair{"vocab_size", c.vocab_size}, std::pair{"hidden_size", c.hidden_size},
                               std::pair{"num_attention_heads", c.num_heads}, std::pair{"num_key_value_heads", c.num_kv_heads},
                               std::pair{"head_dim", c.head_dim}, std::pair{"intermediate_size", c.intermediate_size},
                               std::pair{"moe_intermediate_size", c.moe_intermediate_size},
                               std::pair{family_of(c).experts_key.c_str(), c.num_experts}})
    if (v > kMaxDim) throw r.bad(key, str("is ", v, ", more than ", kMaxDim));
}

}  // namespace

bool HfConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UsageError(str(path, ": not valid JSON: ", e.what()));
  }
}

HfConfig parse_hf_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw UsageError(str(source, ": not a JSON object"));
  Reader r{j, source};
  HfConfig c;
  c.source = source;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type.empty()) throw r.bad("model_type", "is missing");
  const Family* family = find_family(c.model_type);
  if (!family) {
    std::vector<std::string> known;
    for (const Family* f : families()) known.push_back(f->name);
    throw r.bad("model_type", str("'", c.model_type, "' is not a family this parser knows (", join(known, ", "), ")"));
  }
  const Family& f = *family;
  if (f.reads_text_config && j.contains("text_config")) {
    // The multimodal checkpoint: its text_config, with what the composite config holds at its top level.
    const json& t = j["text_config"];
    if (!t.is_object()) throw r.bad("text_config", "must be an object");
    json flat = t;
    flat["model_type"] = f.name;
    for (const char* k : {"tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"})
      if (j.contains(k) && !j[k].is_null() && (!flat.contains(k) || flat[k].is_null() || std::string(k) == "tie_word_embeddings"))
        flat[k] = j[k];
    HfConfig text = parse_hf_config(flat, source + " (text_config)");
    text.source = source;
    text.text_part = true;
    return text;
  }
  c.model_type = f.name;  // a description's other model_type (qwen3_5_text) is its family's
  const ClassDefaults& d = f.defaults;
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.num_layers = r.positive("num_hidden_layers");
  c.num_heads = r.positive("num_attention_heads");
  // Missing: the class's default; null: num_attention_heads, what the classes that accept None turn it into.
  c.num_kv_heads = r.has("num_key_value_heads")                                    ? r.positive("num_key_value_heads")
                   : j.contains("num_key_value_heads") || d.num_kv_heads == 0 ? c.num_heads
                                                                                     : d.num_kv_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    throw r.bad("num_key_value_heads",
                str(c.num_kv_heads, " does not divide num_attention_heads ", c.num_heads,
                    j.contains("num_key_value_heads") ? "" : str(" (the key is not given: ", c.model_type, "'s config class default)")));
  if (r.has("head_dim")) {
    c.head_dim = r.positive("head_dim");
  } else if (d.head_dim > 0) {
    c.head_dim = d.head_dim;  // the class's default (qwen3 128, gemma3_text 256, gpt_oss 64), not hidden_size / heads
  } else {
    if (c.hidden_size % c.num_heads != 0)
      throw r.bad("hidden_size", str(c.hidden_size, " is not a multiple of num_attention_heads and head_dim is not given"));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) throw r.bad("head_dim", str("must be even for RoPE, got ", c.head_dim));
  check_size_bounds(c, r);
  c.rms_norm_eps = r.number_or("rms_norm_eps", d.rms_norm_eps);
  // The config class's default_theta where the config gives none, and its RoPE where it has no rope key at all
  // (GptOssConfig's YaRN).
  if (!d.rope_parameters.is_null() && !r.has("rope_parameters") && !r.has("rope_scaling")) {
    json with = j;
    with["rope_parameters"] = d.rope_parameters;
    c.rope = parse_rope(with, Reader{with, source}, d.rope_theta, d.partial_rotary_factor);
  } else {
    c.rope = parse_rope(j, r, d.rope_theta, d.partial_rotary_factor);
  }
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", d.tie_word_embeddings);
  const std::string act = f.reads_hidden_act ? r.string_or("hidden_act", "silu") : "silu";
  if (act != "silu") throw r.bad("hidden_act", str("'", act, "' is not supported (only silu)"));
  c.bos_token_id = r.token_id("bos_token_id");
  c.eos_token_id = r.token_id("eos_token_id");
  c.pad_token_id = r.token_id("pad_token_id");
  // transformers drops attention probabilities with this rate in training; the attention op has no dropout, so
  // a run would silently train without it.
  const double attention_dropout = r.number_or("attention_dropout", 0.0);
  if (attention_dropout != 0.0)
    throw r.bad("attention_dropout", str("must be 0, got ", attention_dropout, " (attention dropout is not supported)"));

  // Bias keys only where the family's transformers class reads them; elsewhere the class builds no bias, so a
  // true value (a checkpoint with biases) would be dropped: refused instead.
  const std::string& t = c.model_type;
  for (const auto& [key, reads] : {std::pair{"attention_bias", f.reads_attention_bias}, std::pair{"mlp_bias", f.reads_mlp_bias}})
    if (!reads && r.boolean_or(key, false))
      throw r.bad(key, str("true is not supported for ", t, " (transformers' ", t, " builds no such bias)"));
  c.qkv_bias = c.o_bias = f.reads_attention_bias && r.boolean_or("attention_bias", false);
  c.mlp_bias = f.reads_mlp_bias && r.boolean_or("mlp_bias", false);
  if (!f.moe) c.intermediate_size = r.positive("intermediate_size");
  f.read(r, c);  // the family's own keys (models/families/<name>.cpp)
  c.fp8 = parse_fp8_config(j, source);
  if (!c.mxfp4_experts && !c.fp8.present) c.quant = parse_bnb_config(j, source);
  check_size_bounds(c, r);  // the expert sizes, read since
  // transformers divides by sqrt(mean(x²) + eps): eps <= 0 gives inf or NaN on an all-zero row (padding).
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    throw r.bad("rms_norm_eps", str("must be a finite number > 0, got ", c.rms_norm_eps));
  if (c.rope.type == "dynamic" && c.head_dim <= 2)
    throw r.bad("head_dim", "must be > 2 for rope_type dynamic (its base exponent is d/(d-2))");
  // Defensive: parameters that pass each key's check must still give finite frequencies, or every forward is
  // NaN (the fuzz harness holds the parser to this). Dynamic RoPE is checked where its length is known.
  if (c.head_dim <= 4096 && !at::isfinite(rope_inv_freq(c)).all().item<bool>())
    throw r.bad(c.rope.type == "default" ? "rope_theta" : "rope_parameters",
                str("gives non-finite RoPE frequencies for rope_type ", c.rope.type));
  if (c.has_local_rope && c.head_dim <= 4096 && !at::isfinite(rope_inv_freq(c, c.rope_local)).all().item<bool>())
    throw r.bad("rope_parameters.sliding_attention", str("gives non-finite RoPE frequencies for rope_type ", c.rope_local.type));
  return c;
}

at::Tensor rope_inv_freq(const HfConfig& c, const RopeConfig& rope, int64_t seq_len) {
  HfConfig other = c;
  other.rope = rope;
  return rope_inv_freq(other, seq_len);
}

at::Tensor rope_inv_freq(const HfConfig& c, int64_t seq_len) {
  const int64_t dim = c.rope_dim();
  const at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / double(dim);
  at::Tensor inv = 1.0 / at::pow(c.rope.theta, exponents);
  if (c.rope.type == "linear") return inv / c.rope.factor;
  if (c.rope.type == "dynamic") {
    if (seq_len <= c.rope.max_position) return inv;
    // _compute_dynamic_ntk_parameters with a tensor seq_len: the base is computed in fp32, as there.
    const double f = c.rope.factor;
    at::Tensor sl = at::scalar_tensor(seq_len, at::kLong);
    at::Tensor base = c.rope.theta * at::pow(f * sl / double(c.rope.max_position) - (f - 1), double(dim) / double(dim - 2));
    at::Tensor out = 1.0 / at::pow(base, exponents);
    if (!at::isfinite(out).all().item<bool>())  // e.g. a factor beyond fp32: f·L - (f - 1) is inf - inf
      throw UsageError(str(c.source, ": rope_type dynamic with factor ", f, " gives non-finite RoPE frequencies at length ", seq_len));
    return out;
  }
  if (c.rope.type == "yarn") {
    // _compute_yarn_parameters, term for term.
    const double base = c.rope.theta, factor = c.rope.factor, omp = double(c.rope.original_max_position);
    auto correction_dim = [&](double rotations) {
      return (double(dim) * std::log(omp / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = correction_dim(c.rope.beta_fast), high = correction_dim(c.rope.beta_slow);
    if (c.rope.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    at::Tensor pos_freqs = at::pow(base, exponents);
    at::Tensor extrapolation = 1.0 / pos_freqs, interpolation = 1.0 / (factor * pos_freqs);
    at::Tensor ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);
    at::Tensor extrapolation_factor = 1 - ramp;
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  if (c.rope.type != "llama3") return inv;
  // transformers' _compute_llama3_parameters, term for term (fp32).
  const double factor = c.rope.factor, lo = c.rope.low_freq_factor, hi = c.rope.high_freq_factor;
  const double old_len = double(c.rope.original_max_position);
  const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
  at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor llama = at::where(wavelen > low_freq_wavelen, inv / factor, inv);
  at::Tensor smooth = (old_len / wavelen - lo) / (hi - lo);
  at::Tensor smoothed = (1 - smooth) * llama / factor + smooth * llama;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, llama);
}

}  // namespace ax::models
