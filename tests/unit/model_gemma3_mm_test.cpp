// gemma3 multimodal against transformers + peft (goldens: scripts/goldens/make_gemma3_mm_goldens.py, fp32 CPU):
// logits, loss and LoRA gradients of three samples (two images; one image; text only) that transformers ran one
// by one with token_type_ids (the tokens of one image see each other) and that we run packed into two rows with
// padding. Also: the image groups, checkpoint layouts, config refusals, adapters we save, a few training steps.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/device.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "models/gemma3_mm.hpp"
#include "models/register.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"
#include "unit/vl_case_util.hpp"

namespace fs = std::filesystem;
using namespace ax::test::vl;

namespace {

std::string case_path() { return ax::test::case_dir("gemma3_mm").string(); }
std::shared_ptr<ax::safetensors::File> golden() { return ax::safetensors::File::open(case_path() + "/golden.safetensors"); }

// Row 0: sample 0 (two images), padding. Row 1: sample 1 (one image), sample 2 (text only), padding.
Packed packed(const ax::safetensors::File& g) {
  const int64_t n0 = g.get("ids.0").size(0), n1 = g.get("ids.1").size(0), n2 = g.get("ids.2").size(0);
  return packed_batch(g, std::max(n0, n1 + n2) + 3);
}

void check_gemma3_parity(const std::string& backends) {
  auto g = golden();
  Packed p = packed(*g);
  CHECK(check_parity(case_path(), backends, p, *g) == 2 * 7 * 3);  // every projection of the three layers, none in the tower
  // The image mask matters here: transformers' causal-only logits of the image samples are far from ours.
  const at::Tensor logits = load(case_path(), backends, case_path() + "/adapter").model->forward(p.batch, true).logits;
  for (int k = 0; k < 2; ++k) {
    auto [row, off, len] = p.where[k];
    CHECK(rel_max(logits[row].narrow(0, off, len), g->get(ax::str("logits_causal.", k))) > 1e-2);
  }
}

}  // namespace

TEST_CASE("gemma3 multimodal parity: images with bidirectional attention, packed rows with a text-only sample vs transformers+peft") {
  check_gemma3_parity("reference");
  check_gemma3_parity("naive");
}

TEST_CASE("gemma3 multimodal: the image groups are the runs of image tokens within each packed span") {
  const int64_t I = 9;
  std::vector<int64_t> ids{1, I, I, 2, I, I, I, I, 3, I, I};
  // Spans [0, 7) and [7, 11): the run at 4..7 is cut by the span boundary (7) into two groups.
  at::Tensor g = ax::models::image_groups(at::tensor(ids), at::tensor(std::vector<int64_t>{0, 7, 11}), I);
  CHECK(at::equal(g, at::tensor(std::vector<int32_t>{-1, 0, 0, -1, 1, 1, 1, 2, -1, 3, 3})));
}

TEST_CASE("attention op: bidirectional groups in the reference, aten declines to flash and serves them by the reference math") {
  // One sequence of 6 rows, group {2, 3, 4}: row 2 sees rows 0..4, rows 0, 1, 5 are causal; a window of 1 keeps
  // only key i-1..i and the group's rows right of i.
  ax::Registry reg;
  ax::register_builtins(reg);
  auto ks = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  auto op = ks->get<ax::ops::Attention>("fp32");
  at::Tensor q = at::randn({6, 2, 4}, at::kDouble).to(at::kFloat), k = at::randn({6, 1, 4}).to(at::kFloat), v = at::randn({6, 1, 3});
  ax::ops::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 6});
  a.groups = at::tensor(std::vector<int32_t>{-1, -1, 0, 0, 0, -1});
  for (int64_t window : {-1, 1}) {
    CAPTURE(window);
    a.window_left = window;
    at::Tensor out = op->forward(a).out;
    for (int64_t i = 0; i < 6; ++i) {
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < 6; ++j) {
        const bool grouped = i >= 2 && i <= 4 && j >= 2 && j <= 4;
        if ((j <= i || grouped) && (window < 0 || j >= i - window)) keys.push_back(j);
      }
      at::Tensor idx = at::tensor(keys);
      at::Tensor s = at::einsum("hd,kd->hk", {q[i], k.index_select(0, idx).select(1, 0)}) / 2.0;
      at::Tensor want = at::matmul(at::softmax(s, -1), v.index_select(0, idx).select(1, 0));
      CAPTURE(i);
      CHECK(at::allclose(out[i], want, 1e-5, 1e-5));
    }
  }
  a.causal = false;
  a.window_left = -1;
  CHECK_THROWS_WITH_AS(op->forward(a), doctest::Contains("groups need causal = true"), ax::UsageError);
}

TEST_CASE("gemma3 multimodal: the transformers 5 module-tree layout (model.language_model.*, model.vision_tower.vision_model.*) loads the same model") {
  auto g = golden();
  auto src = ax::safetensors::File::open(case_path() + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> renamed;
  for (const auto& t : src->tensors()) {
    std::string n = t.name;
    if (n.rfind("language_model.model.", 0) == 0) n = "model.language_model." + n.substr(21);
    else if (n.rfind("vision_tower.", 0) == 0) n = "model.vision_tower.vision_model." + n.substr(13);
    else if (n.rfind("multi_modal_projector.", 0) == 0) n = "model." + n;
    renamed.emplace_back(n, src->get(t.name));
  }
  fs::path dir = ax::test::scratch_dir("gemma3_mm_v5");
  fs::copy_file(fs::path(case_path()) / "config.json", dir / "config.json");
  ax::safetensors::save((dir / "model.safetensors").string(), renamed);
  auto l = load(dir.string(), "reference", case_path() + "/adapter");
  Packed p = packed(*g);
  check_logits(l.model->forward(p.batch, true).logits, p, *g);
  ax::test::remove_tree(dir);
}

TEST_CASE("gemma3 multimodal config and batch refusals") {
  const nlohmann::json j = ax::test::config_of("gemma3_mm");
  auto refused = [&](nlohmann::json c, const std::string& what) {
    CAPTURE(what);
    CHECK_THROWS_WITH_AS(ax::models::parse_gemma3_mm_config(c, "c.json"), doctest::Contains(what.c_str()), ax::UsageError);
  };
  nlohmann::json c = j;
  c["mm_tokens_per_image"] = 3;
  refused(c, "'mm_tokens_per_image' 3 is not a square");
  c["mm_tokens_per_image"] = 9;
  refused(c, "do not pool evenly to 3 x 3 tokens");
  c = j;
  c["vision_config"]["hidden_act"] = "gelu";
  refused(c, "'vision_config.hidden_act' \"gelu\" is not supported");
  c = j;
  c["vision_config"]["image_size"] = 9;
  refused(c, "'vision_config.image_size' 9 is not a multiple of patch_size 2");
  c = j;
  c["image_token_index"] = 500;
  refused(c, "'image_token_index' 500 is not below text_config.vocab_size 97");
  c = j;
  c["text_config"]["final_logit_softcapping"] = 30.0;
  refused(c, "final_logit_softcapping");
  // Defaults: Gemma3Config's and SiglipVisionConfig's.
  c = j;
  c.erase("mm_tokens_per_image");
  c.erase("image_token_index");
  c.erase("boi_token_index");
  c["vision_config"] = {{"image_size", 896}, {"patch_size", 14}};  // gemma-3-4b's (SiglipVisionConfig's 224 / 16 do not pool to 16 x 16)
  c["text_config"]["vocab_size"] = 262208;
  auto d = ax::models::parse_gemma3_mm_config(c, "c.json");
  CHECK(d.mm_tokens_per_image == 256);
  CHECK(d.image_token_id == 262144);
  CHECK(d.boi_token_id == 255999);
  CHECK(d.vision.hidden_size == 768);
  CHECK(d.vision.num_layers == 12);
  CHECK(d.vision.layer_norm_eps == 1e-6);

  auto g = golden();
  auto l = load(case_path(), "reference", "");
  Packed p = packed(*g);
  p.batch.extras["pixel_values"] = g->get("pixel_values.0");  // 2 images for 3 images' tokens
  CHECK_THROWS_WITH_AS(l.model->forward(p.batch, false), doctest::Contains("holds 12 image tokens (id 90) but 2 images"), ax::UsageError);
  p.batch.extras["pixel_values"] = at::zeros({3, 3, 6, 6});
  CHECK_THROWS_WITH_AS(l.model->forward(p.batch, false), doctest::Contains("takes [n_images, 3, 8, 8]"), ax::UsageError);
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "fc1"};
  CHECK_THROWS_WITH_AS(load(case_path(), "reference", "", spec), doctest::Contains("target 'fc1' names a module of the gemma3 vision tower"),
                       ax::UsageError);
}

TEST_CASE("gemma3 multimodal: adapters we save reload with the same logits and exclude the vision tower for peft") {
  auto g = golden();
  check_adapter_round_trip(case_path(), packed(*g), *g, {"base_model.model.model.language_model.layers.2.self_attn.q_proj.lora_A.weight"}, false);
}

TEST_CASE("gemma3 multimodal: LoRA training on an image+text batch lowers the loss") {
  auto g = golden();
  check_training_lowers_loss(case_path(), packed(*g));
}

TEST_CASE("gemma3 multimodal merge-lora: the merged dir is transformers' merge_and_unload checkpoint, logits equal") {
  auto g = golden();
  check_merge(case_path(), packed(*g));
}

// The same parity on the GPU (fp32, reference backends: the aten attention declines groups to flash anyway).
// Without a CUDA device the case says so and passes; on the GPU machine it is real.
TEST_CASE("gemma3 multimodal on CUDA: parity with transformers (fp32)") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: nothing to compare on this machine");
    return;
  }
  auto g = golden();
  auto l = load(case_path(), "reference", case_path() + "/adapter", std::nullopt, "cuda:0");
  Packed p = packed(*g);
  auto out = l.model->forward(p.batch.to(at::Device("cuda:0")), true);
  check_logits(out.logits.to(at::kCPU), p, *g);
}
