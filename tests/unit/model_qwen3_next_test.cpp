// qwen3_next (Qwen3-Next: Gated DeltaNet with the fused in_proj_qkvz / in_proj_ba, gated attention, sparse and
// dense MLP layers, a sigmoid-gated shared expert) beyond its parity case in model_parity_test.cpp
// (tests/data/models/qwen3_next, scripts/goldens/make_model_goldens.py) and its greedy-generate golden
// (generate_test.cpp): packing, merge-lora, LoRA targets as peft converts them, and the config / checkpoint
// refusals.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/lora.hpp"
#include "unit/model_hybrid_checks.hpp"

namespace fs = std::filesystem;

TEST_CASE("qwen3_next: two samples packed in one row give their own rows' logits and loss (state and conv window reset)") {
  ax::test::check_packed_rows("qwen3_next");
}

TEST_CASE("qwen3_next: merge-lora folds the fused projections' and the experts' adapters into transformers+peft's logits") {
  ax::test::check_merge_lora("qwen3_next");
}

TEST_CASE("qwen3_next: the fused-experts checkpoint form and a hub checkpoint's mtp.* tensors load to the same logits") {
  ax::Registry reg;
  ax::register_builtins(reg);
  const fs::path src = ax::test::case_dir("qwen3_next");
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  const auto cfg = ax::test::config_of("qwen3_next");
  const int64_t E = cfg["num_experts"].get<int64_t>();
  // transformers 5's own layout: experts.gate_up_proj [E, 2I, H] (gate rows, then up) and experts.down_proj [E, H, I].
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& n : ckpt.names())
    if (n.find(".mlp.experts.") == std::string::npos) ts.emplace_back(n, ckpt.get(n));
  for (int64_t layer : {0, 2}) {
    const std::string p = ax::str("model.layers.", layer, ".mlp.experts.");
    std::vector<at::Tensor> gate_up, down;
    for (int64_t e = 0; e < E; ++e) {
      gate_up.push_back(at::cat({ckpt.get(ax::str(p, e, ".gate_proj.weight")), ckpt.get(ax::str(p, e, ".up_proj.weight"))}, 0));
      down.push_back(ckpt.get(ax::str(p, e, ".down_proj.weight")));
    }
    ts.emplace_back(p + "gate_up_proj", at::stack(gate_up));
    ts.emplace_back(p + "down_proj", at::stack(down));
  }
  ts.emplace_back("mtp.fc.weight", at::ones({24, 48}));  // the multi-token-prediction head transformers leaves unread
  const fs::path d = ax::test::scratch_dir("qwen3_next_fused_experts");
  fs::copy_file(src / "config.json", d / "config.json");
  ax::safetensors::save((d / "model.safetensors").string(), ts);
  auto golden = ax::safetensors::File::open((src / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  const at::Tensor want = ax::test::load_hybrid(reg, src.string(), "qwen3_next")->forward(b, true).logits;
  CHECK(ax::test::rel_max(ax::test::load_hybrid(reg, d.string(), "qwen3_next")->forward(b, true).logits, want) <= 1e-6);
  CHECK(ax::test::rel_max(want, golden->get("logits")) <= 1e-4);
  ax::test::remove_tree(d);
}

TEST_CASE("qwen3_next: the config's layers, sizes and defaults (Qwen3NextConfig's)") {
  const nlohmann::json base = ax::test::config_of("qwen3_next");
  auto c = ax::models::parse_hf_config(base, "c.json");
  CHECK(c.gdn.fused);
  CHECK(c.is_linear_layer(0));
  CHECK_FALSE(c.is_linear_layer(1));
  CHECK(c.is_moe_layer(0));
  CHECK_FALSE(c.is_moe_layer(1));  // mlp_only_layers [1]: a dense MLP of intermediate_size
  CHECK(c.intermediate_size == 14);
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.shared_expert_intermediate_size == 10);
  nlohmann::json j = base;
  for (const char* k : {"norm_topk_prob", "intermediate_size", "mlp_only_layers", "decoder_sparse_step"}) j.erase(k);
  j["num_hidden_layers"] = 4;
  j.erase("layer_types");
  j["decoder_sparse_step"] = 2;
  c = ax::models::parse_hf_config(j, "c.json");
  CHECK(c.norm_topk_prob);
  CHECK(c.intermediate_size == 5632);
  for (int64_t i = 0; i < 4; ++i) {
    CHECK(c.is_moe_layer(i) == (i % 2 == 1));
    CHECK(c.is_linear_layer(i) == (i != 3));
  }
}

TEST_CASE("qwen3_next: inconsistent head counts and a fused projection of the wrong shape are refused naming the key or tensor") {
  const nlohmann::json base = ax::test::config_of("qwen3_next");
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = base;
    j[key] = v;
    return ax::test::parse_error(j);
  };
  CHECK(with("linear_num_value_heads", 3).find("'linear_num_value_heads' 3 is not a multiple of linear_num_key_heads 2") !=
        std::string::npos);
  CHECK(with("num_key_value_heads", 3).find("'num_key_value_heads' 3 does not divide") != std::string::npos);
  CHECK(with("num_experts_per_tok", 6).find("'num_experts_per_tok' 6 exceeds the number of experts 5") != std::string::npos);
  CHECK(with("mlp_only_layers", "1").find("'mlp_only_layers' must be a list of layer indices") != std::string::npos);

  ax::Registry reg;
  ax::register_builtins(reg);
  // Sizes the config implies that the checkpoint's fused projections do not have: in_proj_qkvz holds
  // 2·2·6 + 2·4·5 = 64 rows, in_proj_ba 2·4 = 8.
  nlohmann::json cfg = base;
  cfg["linear_value_head_dim"] = 4;
  {
    ax::test::EditedModel edited("qwen3_next", cfg, "qwen3_next_vdim");
    CHECK(ax::test::hybrid_load_error(reg, edited.dir)
              .find("'model.layers.0.linear_attn.in_proj_qkvz.weight' has shape [64, 24] but") != std::string::npos);
  }
  // A checkpoint whose fused projection lost rows (one value head's z) against the right config.
  const fs::path src = ax::test::case_dir("qwen3_next");
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  for (const auto& [key, rows] : {std::pair{"model.layers.2.linear_attn.in_proj_qkvz.weight", int64_t(59)},
                                  std::pair{"model.layers.0.linear_attn.in_proj_ba.weight", int64_t(6)}}) {
    CAPTURE(key);
    const fs::path d = ax::test::scratch_dir("qwen3_next_fused");
    fs::copy_file(src / "config.json", d / "config.json");
    std::vector<std::pair<std::string, at::Tensor>> ts;
    for (const auto& n : ckpt.names()) ts.emplace_back(n, n == key ? ckpt.get(n).narrow(0, 0, rows).contiguous() : ckpt.get(n));
    ax::safetensors::save((d / "model.safetensors").string(), ts);
    const std::string e = ax::test::hybrid_load_error(reg, d);
    CHECK(e.find(ax::str("'", key, "' has shape [", rows, ", 24] but")) != std::string::npos);
    ax::test::remove_tree(d);
  }
  // Qwen3.5's separate projections under model_type qwen3_next: the fused one is missing, by name.
  nlohmann::json q35 = ax::test::config_of("qwen3_5");
  q35["model_type"] = "qwen3_next";
  ax::test::EditedModel separate("qwen3_5", q35, "qwen3_next_separate");
  const std::string e = ax::test::hybrid_load_error(reg, separate.dir);
  CHECK(e.find("missing tensor") != std::string::npos);
  CHECK(e.find("linear_attn.in_proj_qkvz.weight") != std::string::npos);
}

TEST_CASE("qwen3_next: LoRA targets as peft converts them (gate_proj / up_proj / down_proj are the routed experts')") {
  auto c = ax::models::parse_hf_config(ax::test::config_of("qwen3_next"), "c.json");
  const auto sites = ax::models::lora_sites(c);
  ax::LoraSpec spec;
  spec.r = 2;
  spec.alpha = 5;
  spec.targets = {"in_proj_qkvz", "in_proj_ba", "gate_proj", "up_proj", "down_proj"};
  std::set<std::string> paths;
  for (const auto& p : ax::models::plan_lora(spec, "qwen3_next", sites)) {
    paths.insert(p.site.path);
    if (p.site.leaf == "gate_up_proj") CHECK(p.r == 4);  // peft's rank_pattern for the fused pair
  }
  CHECK(paths == std::set<std::string>{"model.layers.0.linear_attn.in_proj_qkvz", "model.layers.0.linear_attn.in_proj_ba",
                                       "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
                                       "model.layers.2.linear_attn.in_proj_qkvz", "model.layers.2.linear_attn.in_proj_ba",
                                       "model.layers.2.mlp.experts.gate_up_proj", "model.layers.2.mlp.experts.down_proj"});
  spec.targets = {"gate_proj"};
  CHECK_THROWS_WITH_AS(ax::models::plan_lora(spec, "qwen3_next", sites), doctest::Contains("must be given together"), ax::UsageError);
  // peft takes any target ending in .gate_proj for the experts: the shared expert's cannot be named.
  spec.targets = {"shared_expert.gate_proj", "shared_expert.up_proj"};
  CHECK_THROWS_WITH_AS(ax::models::plan_lora(spec, "qwen3_next", sites),
                       doctest::Contains("target 'shared_expert.gate_proj' on this qwen3_next model: peft converts every target ending in 'gate_proj' to the routed experts"),
                       ax::UsageError);
  spec.targets = {"mlp.experts.down_proj", "shared_expert_gate"};  // the experts' parameter by its own name: fine
  CHECK(ax::models::plan_lora(spec, "qwen3_next", sites).size() == 4);
  spec.targets = {"in_proj_qkv"};  // Qwen3.5's name
  CHECK_THROWS_WITH_AS(ax::models::plan_lora(spec, "qwen3_next", sites), doctest::Contains("did you mean 'in_proj_qkvz'"),
                       ax::UsageError);
}
