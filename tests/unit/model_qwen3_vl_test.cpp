// qwen3_vl against transformers + peft (goldens: scripts/goldens/make_vlm_goldens.py qwen3_vl, fp32 CPU): logits,
// loss and LoRA gradients of three samples (two images; two images of other shapes; text only) that transformers
// ran one by one and that we run packed into two rows with padding. The images' grids (4x6, 8x10, 6x4, 2x4
// patches) resample a 4x4 learned position table both up and down; deepstack_visual_indexes [2, 0] on a
// 3-layer language model. Also: the interleaved RoPE layout, the other checkpoint layout, config refusals,
// adapters we save (and, through tests/python/check_vlm_peft.py, peft's logits with them), a few training steps.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "models/qwen3_vl.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"
#include "unit/vl_case_util.hpp"

namespace fs = std::filesystem;
using namespace ax::test::vl;

namespace {

std::string case_path() { return ax::test::case_dir("qwen3_vl").string(); }
std::shared_ptr<ax::safetensors::File> golden() {
  return ax::safetensors::File::open((ax::test::case_dir("qwen3_vl") / "golden.safetensors").string());
}

}  // namespace

TEST_CASE("qwen3_vl parity: deepstack, interpolated positions, interleaved mrope, packed rows with a text-only sample vs transformers+peft") {
  auto g = golden();
  for (const char* backends : {"reference", "naive"})
    CHECK(check_parity(case_path(), backends, packed_batch(*g), *g) == 3 * 7 * 2);  // every projection of the three layers, none in the tower
}

TEST_CASE("qwen3_vl: the interleaved mrope layout as contiguous sections") {
  using ax::models::interleaved_sections;
  CHECK(interleaved_sections({4, 2, 2}, 8) == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 2});
  // Qwen3-VL's [24, 20, 20] of 64: T H W repeated 20 times, then 4 more T.
  std::vector<int64_t> want(60, 1);
  want.push_back(4);
  CHECK(interleaved_sections({24, 20, 20}, 64) == want);
  // Height runs out first: T H W, T H W, then T T W T (an empty height section before that W).
  CHECK(interleaved_sections({5, 2, 3}, 10) == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 2, 0, 1, 1});
}

TEST_CASE("qwen3_vl: the save_pretrained layout of transformers 4 (model.layers.*, visual.*) loads the same model") {
  auto g = golden();
  auto src = ax::safetensors::File::open(case_path() + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> renamed;
  for (const auto& t : src->tensors()) {
    std::string n = t.name;
    if (n.rfind("model.visual.", 0) == 0) n = n.substr(6);
    else if (n.rfind("model.language_model.", 0) == 0) n = "model." + n.substr(21);
    renamed.emplace_back(n, src->get(t.name));
  }
  fs::path dir = ax::test::scratch_dir("qwen3_vl_v4");
  fs::copy_file(fs::path(case_path()) / "config.json", dir / "config.json");
  ax::safetensors::save((dir / "model.safetensors").string(), renamed);
  auto l = load(dir.string(), "reference", case_path() + "/adapter");
  Packed p = packed_batch(*g);
  check_logits(l.model->forward(p.batch, true).logits, p, *g);
  ax::test::remove_tree(dir);
}

TEST_CASE("qwen3_vl config: defaults, refusals") {
  nlohmann::json j = ax::test::config_of("qwen3_vl");
  auto c = ax::models::parse_qwen3_vl_config(j, "c.json");
  CHECK(c.text.qk_norm);
  CHECK_FALSE(c.text.tie_word_embeddings);
  CHECK(c.mrope_section == std::vector<int64_t>{4, 2, 2});
  CHECK(c.vision.grid_side() == 4);
  // Qwen3VLConfig's and its sub-configs' defaults where keys are left out (they disagree on the hidden size,
  // which transformers leaves to the checkpoint to reveal; we refuse that, so one is given).
  nlohmann::json bare = {{"model_type", "qwen3_vl"}, {"text_config", {{"hidden_size", 3584}}}};
  auto d = ax::models::parse_qwen3_vl_config(bare, "c.json");
  CHECK(d.vision.patch_size == 16);
  CHECK(d.vision.deepstack_visual_indexes == std::vector<int64_t>{8, 16, 24});
  CHECK(d.vision.out_hidden_size == 3584);
  CHECK(d.text.rope.theta == 500000.0);
  CHECK(d.text.head_dim == 128);
  CHECK(d.mrope_section == std::vector<int64_t>{24, 20, 20});
  CHECK(d.image_token_id == 151655);
  auto refused = [&](nlohmann::json cfg, const std::string& what) {
    CAPTURE(what);
    CHECK_THROWS_WITH_AS(ax::models::parse_qwen3_vl_config(cfg, "c.json"), doctest::Contains(what.c_str()), ax::UsageError);
  };
  nlohmann::json x = j;
  x["text_config"]["rope_parameters"]["mrope_interleaved"] = false;
  refused(x, "'mrope_interleaved' false is not supported");
  x = j;
  x["text_config"]["rope_parameters"]["mrope_section"] = {4, 2, 1};
  refused(x, "'mrope_section' must be three sizes summing to head_dim / 2 = 8");
  x = j;
  x["vision_config"]["deepstack_visual_indexes"] = {0, 3};
  refused(x, "holds 3, not a block index in [0, 3)");
  x = j;
  x["vision_config"]["deepstack_visual_indexes"] = {0, 0};
  refused(x, "holds 0 twice");
  x = j;
  x["text_config"]["num_hidden_layers"] = 1;
  refused(x, "holds 2 blocks but the language model has 1 layers");
  x = j;
  x["vision_config"]["out_hidden_size"] = 40;
  refused(x, "'vision_config.out_hidden_size' is 40");
  x = j;
  x["vision_config"]["hidden_act"] = "relu";
  refused(x, "'hidden_act' must be \"gelu_pytorch_tanh\" or \"gelu\"");
  x = j;
  x["text_config"]["rope_parameters"]["rope_type"] = "yarn";
  x["text_config"]["rope_parameters"]["factor"] = 2.0;
  refused(x, "not supported with multimodal RoPE");
  x = j;
  x["model_type"] = "qwen3_vl_moe";
  refused(x, "'model_type' must be \"qwen3_vl\"");
  // LoRA on the vision tower is refused by name; videos by token.
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "linear_fc1"};
  CHECK_THROWS_WITH_AS(load(case_path(), "reference", "", spec), doctest::Contains("target 'linear_fc1' names a module of the qwen3_vl vision tower"),
                       ax::UsageError);
  auto l = load(case_path(), "reference", "");
  ax::Batch b;
  b.input_ids = at::tensor(std::vector<int64_t>{5, c.video_token_id, 6}).view({1, 3});
  CHECK_THROWS_WITH_AS(l.model->forward(b, true), doctest::Contains("qwen3_vl: token 1 is the video token (91); videos are not supported"),
                       ax::UsageError);
}

TEST_CASE("qwen3_vl: adapters we save reload with the same logits; with AXENGINE_VLM_PEFT_EXPORT_DIR, written for peft") {
  auto g = golden();
  check_adapter_round_trip(case_path(), packed_batch(*g), *g, {"base_model.model.model.language_model.layers.2.self_attn.q_proj.lora_A.weight"}, true);
}

TEST_CASE("qwen3_vl: LoRA training on an image+text batch lowers the loss") {
  auto g = golden();
  check_training_lowers_loss(case_path(), packed_batch(*g));
}

TEST_CASE("qwen3_vl merge-lora: the merged dir is transformers' merge_and_unload checkpoint, logits equal") {
  auto g = golden();
  check_merge(case_path(), packed_batch(*g));
}

// The model on CUDA (the host-built rope index, splice positions, position taps and deepstack rows moved to the
// device) against the CPU, fp32, reference backends on both. Without a CUDA device the case says so and passes;
// on the GPU machine it is real.
TEST_CASE("qwen3_vl on CUDA: image+text logits equal the CPU's (fp32)") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: nothing to compare on this machine");
    return;
  }
  auto g = golden();
  Packed p = packed_batch(*g);
  auto run = [&](const char* device) {
    ax::Registry reg;
    ax::register_builtins(reg);
    ax::ModelLoadOptions o;
    o.dir = case_path();
    o.adapter_dir = case_path() + "/adapter";
    o.dtype = "fp32";
    o.device = device;
    ax::KernelPreferences prefs;
    for (const char* op : {"linear.lora", "attention", "rms_norm", "swiglu", "norm_rope", "linear_ce"}) prefs.prefer[op] = {"reference"};
    o.kernels = std::make_shared<ax::KernelSet>(reg, prefs, ax::detect_device(device == std::string("cpu") ? "cpu" : "cuda"));
    return ax::load_model(reg, o)->forward(p.batch, true).logits.to(at::kCPU);
  };
  at::Tensor cpu = run("cpu"), cuda = run("cuda:0");
  CHECK(rel_max(cuda, cpu) <= 1e-4);
  check_logits(cuda, p, *g);
}
