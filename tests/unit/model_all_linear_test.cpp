// lora.targets = "all-linear": resolved per family as peft 0.21.2 resolves it on transformers 5.23's model
// (tests/data/models/all_linear.json, scripts/goldens/make_all_linear_goldens.py: the LoRA sites get_peft_model
// made on a tiny model of each family, with their ranks and alphas).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "models/lora_all_linear.hpp"
#include "test_util.hpp"
#include "train/lora_config.hpp"

using nlohmann::json;
using namespace ax_test;

namespace {

// "path r=.. alpha=..": a LoRA site as peft made it.
std::string site(const std::string& path, int64_t r, double alpha) { return ax::str(path, " r=", r, " alpha=", alpha); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("lora: targets \"all-linear\" selects what peft's all-linear selects, on every family") {
  const json cases = json::parse(read_file((std::filesystem::path(AXENGINE_TEST_DATA_DIR) / "models" / "all_linear.json").string()));
  REQUIRE(cases.size() == 12);
  for (const auto& c : cases) {
    const std::string family = c["family"].get<std::string>();
    CAPTURE(family);
    const ax::models::HfConfig cfg = ax::models::parse_hf_config(c["config"], family + "/config.json");
    const auto sites = ax::models::lora_sites(cfg);
    ax::LoraSpec spec;
    spec.r = c["r"].get<int64_t>();
    spec.alpha = c["alpha"].get<double>();
    spec.targets = {"all-linear"};
    std::vector<std::string> want, got;
    for (const auto& s : c["sites"]) want.push_back(site(s["path"].get<std::string>(), s["r"].get<int64_t>(), s["alpha"].get<double>()));
    const ax::models::AllLinear all = ax::models::resolve_all_linear(cfg.model_type, sites);
    if (all.not_supported.empty()) {
      for (const auto& p : ax::models::plan_lora(spec, cfg.model_type, sites)) got.push_back(site(p.site.path, p.r, p.alpha));
    } else {
      // peft also puts a LoRA on each router's weight: refused, naming it; what the resolved list selects is the
      // rest of peft's sites, the routers are exactly the rest.
      const std::string e = error_of([&] { ax::models::plan_lora(spec, cfg.model_type, sites); });
      CHECK(e.find("lora: targets \"all-linear\" on this " + family + " model") == 0);
      CHECK(e.find("model.layers.0.mlp.gate.weight") != std::string::npos);
      spec.targets = all.targets;
      for (const auto& p : ax::models::plan_lora(spec, cfg.model_type, sites)) got.push_back(site(p.site.path, p.r, p.alpha));
      for (const auto& r : all.not_supported) got.push_back(site(r, spec.r, spec.alpha));
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    CHECK(got == want);
  }
}

TEST_CASE("lora: all-linear is case-insensitive as in peft, and refused on a multimodal model's vision tower") {
  CHECK(ax::models::is_all_linear({"ALL-Linear"}));
  CHECK_FALSE(ax::models::is_all_linear({"all-linear", "q_proj"}));
  CHECK_FALSE(ax::models::is_all_linear({"all_linear"}));
  // A site peft knows under another path is qwen2_5_vl's language model: peft's all-linear also takes the tower.
  ax::models::LoraSite s{"model.layers.0.self_attn.q_proj", "q_proj", false, 1, 8, 8, "model.language_model.layers.0.self_attn.q_proj"};
  const auto all = ax::models::resolve_all_linear("qwen2", {s});
  REQUIRE(all.not_supported.size() == 1);
  ax::LoraSpec spec;
  spec.targets = {"all-linear"};
  CHECK(error_of([&] { ax::models::plan_lora(spec, "qwen2", {s}); }).find("the vision tower (visual.*)") != std::string::npos);
}

TEST_CASE("lora: lora.targets = \"all-linear\" is peft's shorthand; any other string is refused naming the key") {
  TempDir dir;
  auto lora_of = [&](const std::string& targets) {
    write_file(dir / "run.toml", "[lora]\ntargets = " + targets + "\n");
    return ax::train::read_lora_config(ax::load_config(dir / "run.toml"));
  };
  CHECK(lora_of("\"all-linear\"").spec.targets == std::vector<std::string>{"all-linear"});
  CHECK(lora_of("[\"q_proj\"]").spec.targets == std::vector<std::string>{"q_proj"});
  std::string e;
  try {
    lora_of("\"q_proj\"");
  } catch (const std::exception& x) {
    e = x.what();
  }
  CHECK(e.find("'lora.targets' must be a list of module names or \"all-linear\", not \"q_proj\"") != std::string::npos);
}

TEST_CASE("inspect: shows what lora.targets = \"all-linear\" selects on the model, or why it is refused") {
  const auto dir = [](const char* name) { return (std::filesystem::path(AXENGINE_TEST_DATA_DIR) / "models" / name).string(); };
  CHECK(ax::inspect_model_dir(dir("qwen3")).find("  \"all-linear\": q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj\n") !=
        std::string::npos);
  const std::string moe = ax::inspect_model_dir(dir("qwen3_moe"));
  CHECK(moe.find("  \"all-linear\": q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; refused: peft also "
                 "targets model.layers.0.mlp.gate.weight") != std::string::npos);
}
