// A key a config.json leaves out means what the family's transformers config class takes for it: each case of
// tests/data/models/config_defaults.json (scripts/goldens/make_config_defaults_goldens.py, transformers 5.23)
// is a minimal config.json (model_type and the required sizes) and what transformers makes of it; axengine's
// parse must agree on every key it reads and every quantity it derives from them.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "models/hf_config.hpp"
#include "models/qwen2_5_vl.hpp"
#include "models/qwen3_vl.hpp"
#include "unit/model_case_util.hpp"

using nlohmann::json;

namespace {

void check_rope(const ax::models::RopeConfig& got, const json& want) {
  CHECK(got.type == want["type"].get<std::string>());
  CHECK(got.theta == want["theta"].get<double>());
  if (want.contains("factor")) CHECK(got.factor == want["factor"].get<double>());
  if (want.contains("beta_fast")) CHECK(got.beta_fast == want["beta_fast"].get<double>());
  if (want.contains("beta_slow")) CHECK(got.beta_slow == want["beta_slow"].get<double>());
  if (want.contains("truncate")) CHECK(got.truncate == want["truncate"].get<bool>());
  if (want.contains("original_max_position")) CHECK(got.original_max_position == want["original_max_position"].get<int64_t>());
  CHECK(got.attention_factor == doctest::Approx(want["attention_factor"].get<double>()).epsilon(1e-12));
}

// Compares every key of `want` (HfConfig's names) with the parsed config; returns how many were compared.
int check_config(const ax::models::HfConfig& c, const json& want) {
  int n = 0;
  for (const auto& [key, v] : want.items()) {
    CAPTURE(key);
    ++n;
    if (key == "num_kv_heads") CHECK(c.num_kv_heads == v.get<int64_t>());
    else if (key == "head_dim") CHECK(c.head_dim == v.get<int64_t>());
    else if (key == "rms_norm_eps") CHECK(c.rms_norm_eps == v.get<double>());
    else if (key == "tie_word_embeddings") CHECK(c.tie_word_embeddings == v.get<bool>());
    else if (key == "mlp_act") CHECK(c.mlp_act == v.get<std::string>());
    else if (key == "rope") check_rope(c.rope, v);
    else if (key == "rope_local") {
      CHECK(c.has_local_rope);
      check_rope(c.rope_local, v);
    } else if (key == "attn_scale") CHECK(c.attn_scale == doctest::Approx(v.get<double>()).epsilon(1e-12));
    else if (key == "qkv_bias") CHECK(c.qkv_bias == v.get<bool>());
    else if (key == "o_bias") CHECK(c.o_bias == v.get<bool>());
    else if (key == "mlp_bias") CHECK(c.mlp_bias == v.get<bool>());
    else if (key == "router_aux_loss_coef") CHECK(c.router_aux_loss_coef == v.get<double>());
    else if (key == "output_router_logits") CHECK(c.output_router_logits == v.get<bool>());
    else if (key == "norm_topk_prob") CHECK(c.norm_topk_prob == v.get<bool>());
    else if (key == "decoder_sparse_step") CHECK(c.decoder_sparse_step == v.get<int64_t>());
    else if (key == "mlp_only_layers") CHECK(c.mlp_only_layers == v.get<std::vector<int64_t>>());
    else if (key == "clip_qkv") CHECK(c.clip_qkv == v.get<double>());
    else if (key == "swiglu_alpha") CHECK(c.swiglu_alpha == v.get<double>());
    else if (key == "swiglu_limit") CHECK(c.swiglu_limit == v.get<double>());
    else if (key == "mrope_section") CHECK(c.mrope_section == v.get<std::vector<int64_t>>());
    else if (key == "moe")
      CHECK(std::vector<int64_t>{c.num_experts, c.top_k, c.moe_intermediate_size, c.shared_expert_intermediate_size} ==
            v.get<std::vector<int64_t>>());
    else if (key == "intermediate_size") CHECK(c.intermediate_size == v.get<int64_t>());
    else if (key == "rotary_dim") CHECK(c.rope_dim() == v.get<int64_t>());
    else if (key == "group_moe") CHECK(std::vector<int64_t>{c.n_group, c.topk_group} == v.get<std::vector<int64_t>>());
    else if (key == "routed_scaling_factor") CHECK(c.routed_scaling_factor == v.get<double>());
    else if (key == "mla") {
      const auto& m = c.mla;
      CHECK(std::vector<int64_t>{m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim,
                                 m.rope_interleave} == v.get<std::vector<int64_t>>());
    } else if (key == "mla_softmax_scale") CHECK(c.mla.softmax_scale == doctest::Approx(v.get<double>()).epsilon(1e-12));
    else if (key == "linear_layers") {
      const auto l = v.get<std::vector<bool>>();
      REQUIRE(static_cast<int64_t>(l.size()) == c.num_layers);
      for (int64_t i = 0; i < c.num_layers; ++i) CHECK(c.is_linear_layer(i) == l[static_cast<std::size_t>(i)]);
    } else if (key == "gdn") {
      const auto& g = c.gdn;
      CHECK(std::vector<int64_t>{g.key_heads, g.value_heads, g.key_dim, g.value_dim, g.conv_kernel} == v.get<std::vector<int64_t>>());
    }
    else if (key == "layer_window") {
      const auto w = v.get<std::vector<int64_t>>();
      REQUIRE(static_cast<int64_t>(w.size()) == c.num_layers);
      for (int64_t i = 0; i < c.num_layers; ++i) {
        CAPTURE(i);
        CHECK(c.window(i) == w[static_cast<std::size_t>(i)]);
      }
    } else {
      FAIL("the golden holds a key this test does not compare: " << key);
    }
  }
  return n;
}

}  // namespace

TEST_CASE("hf config: every key a config.json leaves out takes the transformers config class's default, for every family") {
  const json cases = ax::models::read_json_file((ax::test::case_dir("") / "config_defaults.json").string());
  REQUIRE(cases.is_array());
  std::set<std::string> families;
  for (const auto& k : cases) {
    const std::string name = k["name"].get<std::string>();
    CAPTURE(name);
    const json& config = k["config"];
    const bool vl = config["model_type"] == "qwen2_5_vl", vl_moe = config["model_type"] == "qwen3_vl_moe";
    ax::models::HfConfig c;
    try {
      c = vl       ? ax::models::parse_qwen2_5_vl_config(config, name + "/config.json").text
          : vl_moe ? ax::models::parse_qwen3_vl_moe_config(config, name + "/config.json").text
                   : ax::models::parse_hf_config(config, name + "/config.json");
    } catch (const ax::UsageError& e) {
      FAIL_CHECK(e.what());
      continue;
    }
    CHECK(check_config(c, k["expect"]) >= 10);
    families.insert(config["model_type"].get<std::string>());
  }
  // Every family the parser knows, and the one read through it.
  CHECK(families == std::set<std::string>{"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma3_text", "olmoe",
                                          "gpt_oss", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen2_5_vl",
                                          "glm4_moe", "deepseek_v3", "qwen3_vl_moe"});
}

TEST_CASE("hf config: a class default num_key_value_heads that does not divide the heads is named as the class's") {
  json c = {{"model_type", "mistral"}, {"vocab_size", 16}, {"hidden_size", 24}, {"num_hidden_layers", 1},
            {"num_attention_heads", 6}, {"intermediate_size", 8}};
  CHECK(ax::test::parse_error(c) ==
        "dir/config.json: 'num_key_value_heads' 8 does not divide num_attention_heads 6 (the key is not given: mistral's "
        "config class default)");
  c["num_key_value_heads"] = nullptr;  // None: the class takes num_attention_heads
  CHECK(ax::test::parse_error(c) == "");
  CHECK(ax::models::parse_hf_config(c, "x").num_kv_heads == 6);
}
