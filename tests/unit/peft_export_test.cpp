// Adapters axengine writes: they reload in axengine with identical logits, and (driven by
// tests/python/check_peft_adapters.py, the CTest test peft_loads_axengine_adapters) HF peft loads them
// and reproduces axengine's logits. With AXENGINE_PEFT_EXPORT_DIR set, the cases are written there for
// that script; otherwise to a scratch dir that is removed afterwards.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/register.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

struct Case {
  const char* name;
  std::vector<std::string> targets;
  bool rslora;
  std::string out = "";  // the case's dir under the export root when not `name` (a second case on one model)
};

std::unique_ptr<ax::Model> load(ax::Registry& reg, const std::string& dir, std::optional<ax::LoraSpec> spec,
                                 const std::string& adapter, const ax::WeightPolicy& weights = {}) {
  ax::ModelLoadOptions o;
  o.dir = dir;
  o.weights = weights;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  o.lora = std::move(spec);
  o.adapter_dir = adapter;
  return ax::load_model(reg, o);
}

}  // namespace

TEST_CASE("peft export: adapters and merged models written by axengine reload with the same logits") {
  const char* env = std::getenv("AXENGINE_PEFT_EXPORT_DIR");
  fs::path root = env ? fs::path(env) : ax::test::scratch_dir("peft_export");
  fs::create_directories(root);
  ax::Registry reg;
  ax::register_builtins(reg);  // reference kernels + model families, as a run gets them
  const std::vector<Case> cases = {
      {"llama", {"q_proj", "v_proj", "down_proj"}, false},
      {"qwen2", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"}, false},
      {"mistral", {"k_proj", "o_proj", "up_proj", "down_proj"}, true},
      {"qwen3", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, true},
      {"qwen3_moe", {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, false},
      {"qwen3_moe_top1", {"k_proj", "down_proj"}, true},
      {"mixtral", {"q_proj", "w1", "w3", "w2"}, false},
      {"gemma3", {"q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"}, true},
      {"olmoe", {"v_proj", "gate_proj", "up_proj", "down_proj"}, false},
      {"gpt_oss", {"q_proj", "k_proj", "v_proj", "o_proj"}, true},
      {"gpt_oss_mxfp4", {"q_proj", "v_proj"}, false},  // packed MXFP4 experts: the merge writes them dense
      // gpt_oss's experts by peft's parameter names (target_parameters, nested ParamWrapper keys), dense and on
      // the packed MXFP4 base; down_proj alone: the un-nested keys.
      {"gpt_oss", {"q_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}, false, "gpt_oss_experts"},
      {"gpt_oss_mxfp4", {"o_proj", "gate_up_proj", "experts.down_proj"}, true, "gpt_oss_mxfp4_experts"},
      {"gpt_oss", {"down_proj"}, false, "gpt_oss_experts_down"},
      // A tied config over a stored, different head (kept, as transformers keeps it): the merge writes the head.
      {"qwen2_stored_head", {"q_proj", "v_proj", "down_proj"}, false},
      {"gemma3_stored_head", {"k_proj", "up_proj"}, true},
      // Gated DeltaNet projections (linear_attn.*) beside the attention and MLP ones.
      {"qwen3_5", {"in_proj_qkv", "in_proj_z", "in_proj_b", "out_proj", "q_proj", "down_proj"}, true},
      // qwen3_5_moe: the shared expert's modules by peft's bare names, the routed experts by their parameters.
      {"qwen3_5_moe", {"in_proj_qkv", "in_proj_a", "k_proj", "gate_proj", "down_proj", "mlp.experts.gate_up_proj",
                       "mlp.experts.down_proj"}, false},
      // qwen3_next: the fused projections; gate_proj / up_proj / down_proj converted to the experts (peft).
      {"qwen3_next", {"in_proj_qkvz", "in_proj_ba", "out_proj", "v_proj", "gate_proj", "up_proj", "down_proj",
                      "shared_expert_gate"}, true},
      // The group-router families: attention (MLA's projections) and the routed experts by peft's converted names.
      {"glm4_moe", {"q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"}, false},
      {"deepseek_v3", {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "down_proj"}, true},
      {"deepseek_v3_qproj", {"q_proj", "kv_b_proj", "gate_proj", "up_proj"}, false},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string base = (fs::path(AXENGINE_TEST_DATA_DIR) / "models" / c.name).string();
    ax::LoraSpec spec;
    spec.targets = c.targets;
    spec.r = 3;
    spec.alpha = 7;
    spec.rslora = c.rslora;
    spec.seed = 5;
    auto model = load(reg, base, spec, "");
    {  // B starts at zero; make it matter.
      at::NoGradGuard ng;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
      for (auto& [n, t] : model->trainable_parameters())
        if (n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_B") == 0) t.normal_(0, 0.5, gen);
    }
    auto g = ax::safetensors::File::open(base + "/golden.safetensors");
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    at::Tensor logits = model->forward(b, true).logits.detach();
    at::Tensor plain = load(reg, base, std::nullopt, "")->forward(b, true).logits.detach();
    CHECK((logits - plain).abs().max().item<double>() > 1e-3);  // the adapter changes the output

    fs::path out = root / (c.out.empty() ? std::string(c.name) : c.out);
    fs::create_directories(out);
    model->save_adapter((out / "adapter").string());
    ax::safetensors::save((out / "expected.safetensors").string(), {{"input_ids", b.input_ids}, {"logits", logits}});
    {  // the base dir, for the python side
      std::ofstream(out / "base_dir.txt") << base;
    }
    auto reloaded = load(reg, base, std::nullopt, (out / "adapter").string());
    CHECK((reloaded->forward(b, true).logits - logits).abs().max().item<double>() <= 1e-6);

    ax::merge_lora_dir(reg, base, (out / "adapter").string(), (out / "merged").string(), "fp32");
    auto merged = load(reg, (out / "merged").string(), std::nullopt, "");
    CHECK((merged->forward(b, true).logits - logits).abs().max().item<double>() <= 1e-4);
  }
  if (!env) ax::test::remove_tree(root);
}

// QLoRA: the adapter is trained against the nf4-packed base, so peft's fair golden is the base whose
// projections went through nf4 and back (the python side packs the HF model's own parameters itself, with
// bitsandbytes when installed, else its algorithm in torch) — qlora.json tells it the policy.
TEST_CASE("peft export: QLoRA adapters on an nf4 base reload in peft with the same logits") {
  const char* env = std::getenv("AXENGINE_PEFT_EXPORT_DIR");
  fs::path root = env ? fs::path(env) : ax::test::scratch_dir("peft_export_qlora");
  fs::create_directories(root);
  ax::Registry reg;
  ax::register_builtins(reg);
  ax::WeightPolicy nf4;
  nf4.format = "nf4";
  nf4.blocksize = 16;  // the test models' projections hold multiples of 16 elements, not of 64
  // qwen3_5: its linear-attention projections packed too (the MoE hybrids' [1, 24] shared_expert_gate is not a
  // multiple of 16: model_quant_test.cpp covers their QLoRA); glm4_moe: shared experts and a dense layer too;
  // deepseek_v3_qproj: MLA's projections, the routed and shared experts (every size a multiple of 16, unlike
  // the deepseek_v3 case's q_b_proj); deepseek_v3_fp8: QLoRA over an FP8 checkpoint (dequantised at load, as
  // transformers does, then packed).
  for (const char* name : {"llama", "qwen3_moe", "qwen3_5", "glm4_moe", "deepseek_v3_qproj", "deepseek_v3_fp8"}) {
    CAPTURE(name);
    const std::string base = (fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name).string();
    ax::LoraSpec spec;
    spec.targets = {"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (std::string(name) == "qwen3_5") spec.targets.insert(spec.targets.end(), {"in_proj_qkv", "in_proj_b", "out_proj"});
    if (std::string(name) == "deepseek_v3_qproj")
      spec.targets = {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (std::string(name) == "deepseek_v3_fp8")
      spec.targets = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    spec.r = 3;
    spec.alpha = 7;
    spec.seed = 5;
    auto model = load(reg, base, spec, "", nf4);
    CHECK(model->weight_stats().packed_params > 0);
    CHECK(model->weight_stats().kept.empty());
    {
      at::NoGradGuard ng;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
      for (auto& [n, t] : model->trainable_parameters())
        if (n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_B") == 0) t.normal_(0, 0.5, gen);
    }
    auto g = ax::safetensors::File::open(base + "/golden.safetensors");
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    at::Tensor logits = model->forward(b, true).logits.detach();
    at::Tensor dense = load(reg, base, spec, "")->forward(b, true).logits.detach();
    CHECK((logits - dense).abs().max().item<double>() > 1e-4);  // the packed base is what ran

    fs::path out = root / (std::string("qlora_") + name);
    fs::create_directories(out);
    model->save_adapter((out / "adapter").string());
    ax::safetensors::save((out / "expected.safetensors").string(), {{"input_ids", b.input_ids}, {"logits", logits}});
    std::ofstream(out / "base_dir.txt") << base;
    std::ofstream(out / "qlora.json") << "{\"format\": \"nf4\", \"blocksize\": 16, \"double_quant\": false}\n";
    auto reloaded = load(reg, base, std::nullopt, (out / "adapter").string(), nf4);
    CHECK((reloaded->forward(b, true).logits - logits).abs().max().item<double>() <= 1e-6);
    // merge-lora dequantises the packed base: a dense model with the QLoRA model's logits.
    ax::merge_lora_dir(reg, base, (out / "adapter").string(), (out / "merged").string(), "fp32", nf4);
    auto merged = load(reg, (out / "merged").string(), std::nullopt, "");
    CHECK(merged->weight_stats().packed_params == 0);
    CHECK((merged->forward(b, true).logits - logits).abs().max().item<double>() <= 1e-4);
  }
  if (!env) ax::test::remove_tree(root);
}
