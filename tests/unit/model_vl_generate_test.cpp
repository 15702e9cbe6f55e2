// KV-cached generation with images for the vision-language families (models/vl_decode.hpp): greedy tokens equal
// transformers' generate(do_sample=False) with and without the peft adapter (goldens:
// scripts/goldens/make_vlm_generate_goldens.py over the parity dirs' samples: two images, one or two images, text
// only), the three samples prefilled together in one batch and one at a time; the cached logits equal the full
// forward's; images given at the wrong time or not matching the placeholders are refused naming the row.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include "axengine/device.hpp"
#include "axengine/error.hpp"
#include "train/generate.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"
#include "unit/vl_case_util.hpp"

namespace fs = std::filesystem;
using namespace ax::test::vl;

namespace {

struct Samples {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<ax::DecodeImages> images;
};

// golden.safetensors' samples as prompts and the images their processor would give (pixel_values, and for the
// Qwen VLs image_grid_thw).
Samples samples(const std::string& name) {
  auto g = ax::safetensors::File::open((ax::test::case_dir(name) / "golden.safetensors").string());
  Samples s;
  for (int k = 0; k < 3; ++k) {
    at::Tensor ids = g->get(ax::str("ids.", k)).to(at::kLong).contiguous();
    s.prompts.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
    ax::DecodeImages im;
    if (g->find(ax::str("pixel_values.", k))) {
      im["pixel_values"] = g->get(ax::str("pixel_values.", k));
      if (g->find(ax::str("grid.", k))) im["image_grid_thw"] = g->get(ax::str("grid.", k));
    }
    s.images.push_back(std::move(im));
  }
  return s;
}

nlohmann::json generate_golden(const std::string& name) {
  std::ifstream in(ax::test::case_dir(name) / "generate_golden.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

const char* kCases[] = {"qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3_mm"};

}  // namespace

TEST_CASE("generate with images: greedy tokens equal transformers' generate, batched and alone, base and adapter") {
  for (const std::string name : kCases) {
    const nlohmann::json g = generate_golden(name);
    const Samples s = samples(name);
    for (const std::string variant : {"base", "adapter"}) {
      CAPTURE(name);
      CAPTURE(variant);
      const std::string dir = ax::test::case_dir(name).string();
      auto l = load(dir, "reference", variant == "adapter" ? dir + "/adapter" : "");
      l.model->set_training(false);
      auto& dec = ax::train::decoder_of(*l.model);
      ax::train::GenerateOptions o;  // greedy, no eos: every answer is max_new_tokens long
      o.max_new_tokens = g["max_new_tokens"].get<int64_t>();
      const auto want = g["tokens"][variant].get<std::vector<std::vector<int32_t>>>();
      for (int64_t batch : {3, 1}) {
        CAPTURE(batch);
        o.batch_size = batch;
        auto gens = ax::train::generate(dec, s.prompts, o, {}, {}, s.images);
        for (std::size_t k = 0; k < gens.size(); ++k) CHECK(gens[k].tokens == want[k]);
      }
    }
  }
}

TEST_CASE("generate with images: the cached decode's logits equal the full forward's over the whole row") {
  at::NoGradGuard no_grad;
  for (const std::string name : kCases) {
    CAPTURE(name);
    const std::string dir = ax::test::case_dir(name).string();
    auto l = load(dir, "reference", dir + "/adapter");
    l.model->set_training(false);
    auto& img = dynamic_cast<ax::ImageDecode&>(*l.model);
    const Samples s = samples(name);
    // Sample 0 (two images) prefilled, then three tokens appended one at a time: each step's logits equal the
    // forward's last-position logits over the row so far (its image positions and, after them, the delta).
    std::vector<int64_t> row(s.prompts[0].begin(), s.prompts[0].end());
    auto cache = ax::train::decoder_of(*l.model).new_cache(1, static_cast<int64_t>(row.size()) + 3);
    at::Tensor logits = img.decode_images({row}, {s.images[0]}, *cache);
    for (int64_t next : {5, 11, 7}) {
      ax::Batch b;
      b.input_ids = at::tensor(row, at::kLong).unsqueeze(0);
      b.extras = s.images[0];
      at::Tensor full = l.model->forward(b, true).logits.reshape({static_cast<int64_t>(row.size()), -1})[-1].to(at::kFloat);
      CHECK(rel_max(logits[0], full) <= 1e-5);
      row.push_back(next);
      logits = img.decode_images({{next}}, {}, *cache);
    }
  }
}

TEST_CASE("generate with images: images at the wrong time or not matching the placeholders are refused, naming the row") {
  for (const std::string name : kCases) {
    CAPTURE(name);
    const std::string dir = ax::test::case_dir(name).string();
    auto l = load(dir, "reference", "");
    auto& img = dynamic_cast<ax::ImageDecode&>(*l.model);
    auto& dec = ax::train::decoder_of(*l.model);
    const Samples s = samples(name);
    std::vector<int64_t> two(s.prompts[0].begin(), s.prompts[0].end()), one(s.prompts[1].begin(), s.prompts[1].end()),
        text(s.prompts[2].begin(), s.prompts[2].end());
    auto cache = dec.new_cache(2, 200);
    // Placeholders without their images (row 1), and images for a row without placeholders.
    CHECK_THROWS_WITH_AS(img.decode_images({text, two}, {}, *cache), doctest::Contains("row 1"), ax::UsageError);
    CHECK_THROWS_WITH_AS(img.decode_images({text, text}, {{}, s.images[0]}, *cache), doctest::Contains("row 1"), ax::UsageError);
    // One image's pixels for a row with two images' placeholders.
    CHECK_THROWS_WITH_AS(img.decode_images({one, two}, {s.images[1], s.images[1]}, *cache), doctest::Contains("row 1"),
                         ax::UsageError);
    // Nothing was kept of the refused steps; then images for a row that holds tokens already.
    CHECK(cache->length(0) == 0);
    img.decode_images({text, {}}, {}, *cache);
    CHECK_THROWS_WITH_AS(img.decode_images({one, {}}, {s.images[1], {}}, *cache), doctest::Contains("row 0"), ax::UsageError);
  }
}

TEST_CASE("generate with images on CUDA: greedy tokens equal transformers' (fp32, the device's kernels)") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: nothing to compare on this machine");
    return;
  }
  for (const std::string name : kCases) {
    CAPTURE(name);
    const std::string dir = ax::test::case_dir(name).string();
    ax::Registry reg;
    ax::register_builtins(reg);
    ax::ModelLoadOptions o;
    o.dir = dir;
    o.adapter_dir = dir + "/adapter";
    o.dtype = "fp32";
    o.device = "cuda:0";
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::detect_device("cuda"));
    auto model = ax::load_model(reg, o);
    model->set_training(false);
    const nlohmann::json g = generate_golden(name);
    const Samples s = samples(name);
    ax::train::GenerateOptions opts;
    opts.max_new_tokens = g["max_new_tokens"].get<int64_t>();
    opts.batch_size = 3;
    auto gens = ax::train::generate(ax::train::decoder_of(*model), s.prompts, opts, {}, {}, s.images);
    const auto want = g["tokens"]["adapter"].get<std::vector<std::vector<int32_t>>>();
    for (std::size_t k = 0; k < gens.size(); ++k) CHECK(gens[k].tokens == want[k]);
  }
}
