// qwen2_5_vl against transformers + peft (goldens: scripts/goldens/make_vlm_goldens.py, fp32 CPU): logits, loss
// and LoRA gradients of three samples (two images of different sizes; one image; text only) that transformers
// ran one by one and that we run packed into two rows with padding. Also: the rope index, both checkpoint
// layouts, config refusals, adapters we save, and a few training steps.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/device.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "models/qwen2_5_vl.hpp"
#include "models/register.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"
#include "unit/vl_case_util.hpp"

namespace fs = std::filesystem;
using ax::models::Qwen25VlModel;
using namespace ax::test::vl;

namespace {

std::string case_path() { return ax::test::case_dir("qwen2_5_vl").string(); }
std::shared_ptr<ax::safetensors::File> golden() {
  return ax::safetensors::File::open((ax::test::case_dir("qwen2_5_vl") / "golden.safetensors").string());
}

}  // namespace

TEST_CASE("qwen2_5_vl parity: images of three sizes, several per sample, packed rows with a text-only sample vs transformers+peft") {
  auto g = golden();
  for (const char* backends : {"reference", "naive"})
    CHECK(check_parity(case_path(), backends, packed_batch(*g), *g) == 2 * 7 * 2);  // every projection of both layers, none in the tower
}

TEST_CASE("qwen2_5_vl: the transformers 5 checkpoint layout (model.language_model.*, model.visual.*) loads the same model") {
  auto g = golden();
  auto src = ax::safetensors::File::open(case_path() + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> renamed;
  for (const auto& t : src->tensors()) {
    std::string n = t.name;
    if (n.rfind("visual.", 0) == 0) n = "model." + n;
    else if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
    renamed.emplace_back(n, src->get(t.name));
  }
  fs::path dir = ax::test::scratch_dir("qwen2_5_vl_v5");
  fs::copy_file(fs::path(case_path()) / "config.json", dir / "config.json");
  ax::safetensors::save((dir / "model.safetensors").string(), renamed);
  auto l = load(dir.string(), "reference", case_path() + "/adapter");
  Packed p = packed_batch(*g);
  check_logits(l.model->forward(p.batch, true).logits, p, *g);
  ax::test::remove_tree(dir);
}

// text_config.tie_word_embeddings = true (a transformers 4 save; Qwen2_5_VLConfig forwards it to the top level and
// ties) over the checkpoint's own, different lm_head.weight: transformers keeps the stored head, so the untied
// golden's logits still hold, in both checkpoint layouts.
TEST_CASE("qwen2_5_vl: a tied text_config over a stored, different lm_head keeps the stored head") {
  auto g = golden();
  nlohmann::json cfg = ax::test::config_of("qwen2_5_vl");
  cfg["text_config"]["tie_word_embeddings"] = true;
  for (bool v5 : {false, true}) {
    CAPTURE(v5);
    auto src = ax::safetensors::File::open(case_path() + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> ts;
    for (const auto& t : src->tensors()) {
      std::string n = t.name;
      if (v5 && n.rfind("visual.", 0) == 0) n = "model." + n;
      else if (v5 && n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
      ts.emplace_back(n, src->get(t.name));
    }
    fs::path dir = ax::test::scratch_dir("qwen2_5_vl_tied");
    std::ofstream(dir / "config.json") << cfg.dump();
    ax::safetensors::save((dir / "model.safetensors").string(), ts);
    auto l = load(dir.string(), "reference", case_path() + "/adapter");
    CHECK_FALSE(l.as<Qwen25VlModel>().text().config().tie_word_embeddings);
    Packed p = packed_batch(*g);
    check_logits(l.model->forward(p.batch, true).logits, p, *g);
    CHECK(ax::inspect_model_dir(dir.string()).find("untied head") != std::string::npos);
    ax::test::remove_tree(dir);
  }
}

TEST_CASE("qwen2_5_vl: rope index as transformers' get_rope_index, per packed span") {
  ax::models::VlConfig cfg = ax::models::parse_qwen2_5_vl_config(ax::test::config_of("qwen2_5_vl"), "config.json");
  const int64_t I = cfg.image_token_id, V = cfg.vision_start_token_id, E = cfg.vision_end_token_id;
  // Span 0: 2 text, <vs>, a 1x4x6 grid (2x3 merged), <ve>, 1 text. Span 1: 3 text.
  std::vector<int64_t> ids{5, 6, V, I, I, I, I, I, I, E, 7, 8, 9, 10};
  at::Tensor pos = ax::models::mrope_positions(at::tensor(ids), at::tensor(std::vector<int64_t>{0, 11, 14}), {{1, 4, 6}}, cfg);
  std::vector<std::vector<int64_t>> want{{0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 0, 1, 2},
                                         {0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 0, 1, 2},
                                         {0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 0, 1, 2}};
  for (int a = 0; a < 3; ++a) {
    CAPTURE(a);
    CHECK(at::equal(pos[a], at::tensor(want[a])));
  }
  auto err = [&](std::vector<int64_t> t, ax::models::Grids grids) {
    try {
      ax::models::mrope_positions(at::tensor(t), at::tensor(std::vector<int64_t>{0, int64_t(t.size())}), grids, cfg);
    } catch (const ax::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err({5, I, I, I, 6}, {{1, 4, 6}}).find("needs 6 placeholder tokens but its run at token 1 has 3") != std::string::npos);
  CHECK(err({5, I, I, I, I, I, I}, {{1, 4, 6}, {1, 2, 2}}).find("2 images but the tokens hold 1") != std::string::npos);
  CHECK(err({5, I, 6}, {}).find("more image placeholder runs") != std::string::npos);
  CHECK(err({5, cfg.video_token_id}, {}).find("videos are not supported") != std::string::npos);
  // Grids the tower cannot take.
  CHECK_THROWS_WITH_AS(ax::models::read_grids(at::tensor(std::vector<int64_t>{1, 3, 4}).view({1, 3}), cfg.vision),
                       doctest::Contains("not multiples of spatial_merge_size"), ax::UsageError);
  CHECK_THROWS_WITH_AS(ax::models::read_grids(at::tensor(std::vector<int64_t>{1, 4}).view({1, 2}), cfg.vision),
                       doctest::Contains("must be [n_images, 3]"), ax::UsageError);
}

TEST_CASE("qwen2_5_vl config: transformers 4 layout, refusals") {
  nlohmann::json j = ax::test::config_of("qwen2_5_vl");
  // transformers 4: the text keys at the top level, rope_scaling {type: mrope}.
  nlohmann::json v4 = j["text_config"];
  v4.erase("rope_parameters");
  v4["rope_theta"] = 1000.0;
  v4["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {1, 2, 3}}};
  for (const char* k : {"model_type", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                        "tie_word_embeddings"})
    v4[k] = j[k];
  auto a = ax::models::parse_qwen2_5_vl_config(j, "c.json"), b = ax::models::parse_qwen2_5_vl_config(v4, "c.json");
  CHECK(a.text.mrope_section == b.text.mrope_section);
  CHECK(a.text.rope.theta == b.text.rope.theta);
  CHECK(a.text.hidden_size == b.text.hidden_size);
  CHECK(a.vision.window_size == b.vision.window_size);
  auto refused = [&](nlohmann::json c, const std::string& what) {
    CAPTURE(what);
    CHECK_THROWS_WITH_AS(ax::models::parse_qwen2_5_vl_config(c, "c.json"), doctest::Contains(what.c_str()), ax::UsageError);
  };
  nlohmann::json c = j;
  c["model_type"] = "qwen2_vl";
  refused(c, "Qwen2-VL) is not supported");
  c = j;
  c["text_config"]["rope_parameters"]["mrope_section"] = {2, 2, 3};
  refused(c, "'mrope_section' must be three sizes summing to head_dim / 2 = 6");
  c = j;
  c["vision_config"]["out_hidden_size"] = 40;
  refused(c, "'vision_config.out_hidden_size' is 40");
  c = j;
  c["vision_config"]["window_size"] = 6;
  refused(c, "'vision_config.window_size' 6 is not a multiple");
  c = j;
  c["vision_config"]["fullatt_block_indexes"] = {3};
  refused(c, "not a block index in [0, 3)");
  c = j;
  c["vision_config"]["hidden_act"] = "gelu";
  refused(c, "'vision_config.hidden_act' must be \"silu\"");
  c = j;
  c["text_config"]["rope_parameters"]["rope_type"] = "yarn";
  c["text_config"]["rope_parameters"]["factor"] = 2.0;
  refused(c, "not supported with multimodal RoPE");
  // LoRA on the vision tower is refused by name.
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "qkv"};
  CHECK_THROWS_WITH_AS(load(case_path(), "reference", "", spec), doctest::Contains("target 'qkv' names a module of the qwen2_5_vl vision tower"),
                       ax::UsageError);
}

TEST_CASE("qwen2_5_vl: adapters we save reload with the same logits; with AXENGINE_VLM_PEFT_EXPORT_DIR, written for peft") {
  auto g = golden();
  check_adapter_round_trip(case_path(), packed_batch(*g), *g, {"base_model.model.model.language_model.layers.1.self_attn.q_proj.lora_A.weight"}, true);
}

TEST_CASE("qwen2_5_vl: LoRA training on an image+text batch lowers the loss") {
  auto g = golden();
  check_training_lowers_loss(case_path(), packed_batch(*g));
}

// On CUDA the vision tower pads its MLP's intermediate size to a multiple of 8 (cuBLAS's aligned kernels);
// a checkpoint with intermediate 20 (the test model's 24, sliced) gives the CPU's logits, fp32, reference
// backends. Without a CUDA device the case says so and passes; on the GPU machine it is real.
TEST_CASE("qwen2_5_vl on CUDA: a vision MLP padded to a multiple of 8 gives the CPU logits (fp32)") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: nothing to compare on this machine");
    return;
  }
  auto src = ax::safetensors::File::open(case_path() + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> sliced;
  for (const auto& t : src->tensors()) {
    at::Tensor x = src->get(t.name);
    if (t.name.find("mlp.gate_proj") != std::string::npos || t.name.find("mlp.up_proj") != std::string::npos)
      x = t.name.rfind("visual.", 0) == 0 ? x.narrow(0, 0, 20).contiguous() : x;
    if (t.name.rfind("visual.", 0) == 0 && t.name.find("mlp.down_proj.weight") != std::string::npos) x = x.narrow(1, 0, 20).contiguous();
    sliced.emplace_back(t.name, x);
  }
  fs::path dir = ax::test::scratch_dir("qwen2_5_vl_i20");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fs::path(case_path()) / "config.json"));
  REQUIRE(cfg["vision_config"]["intermediate_size"] == 24);
  cfg["vision_config"]["intermediate_size"] = 20;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  ax::safetensors::save((dir / "model.safetensors").string(), sliced);
  auto g = golden();
  Packed p = packed_batch(*g);
  auto run = [&](const char* device) {
    ax::Registry reg;
    ax::register_builtins(reg);
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.dtype = "fp32";
    o.device = device;
    ax::KernelPreferences prefs;
    for (const char* op : {"linear.lora", "attention", "rms_norm", "swiglu", "linear_ce"}) prefs.prefer[op] = {"reference"};
    o.kernels = std::make_shared<ax::KernelSet>(reg, prefs, ax::detect_device(device == std::string("cpu") ? "cpu" : "cuda"));
    return ax::load_model(reg, o)->forward(p.batch, true).logits.to(at::kCPU);
  };
  at::Tensor cpu = run("cpu"), cuda = run("cuda:0");
  CHECK(rel_max(cuda, cpu) <= 1e-4);
  ax::test::remove_tree(dir);
}

TEST_CASE("qwen2_5_vl merge-lora: the merged dir is transformers' merge_and_unload checkpoint, logits equal") {
  auto g = golden();
  check_merge(case_path(), packed_batch(*g));
}
