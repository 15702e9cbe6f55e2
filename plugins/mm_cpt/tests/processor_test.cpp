// The C++ Qwen2-VL processor against transformers' fast processor (Qwen2VLImageProcessor, torchvision
// backend) on the committed images (scripts/goldens/make_mm_goldens.py): our decoders give PIL's pixels
// (after exif_transpose and convert_to_rgb), and our pixel_values / image_grid_thw equal transformers' on them.
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "image.hpp"
#include "processor.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using namespace ax::mm;

namespace {
const std::string kData = MM_CPT_TEST_DATA;
std::shared_ptr<ax::safetensors::File> goldens() {
  static auto f = ax::safetensors::File::open(kData + "/processor_goldens.safetensors");
  return f;
}
std::vector<std::string> image_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kData + "/images")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

TEST_CASE("mm_cpt processor: smart_resize equals transformers' (rounding half to even, min/max bounds, ratio)") {
  // Values from transformers' smart_resize (factor 28).
  CHECK((smart_resize(61, 97, 28, 3136, 12544) == std::pair<int64_t, int64_t>{56, 84}));
  CHECK((smart_resize(480, 640, 28, 3136, 1003520) == std::pair<int64_t, int64_t>{476, 644}));
  CHECK((smart_resize(11, 13, 28, 3136, 12544) == std::pair<int64_t, int64_t>{56, 84}));
  CHECK((smart_resize(42, 42, 28, 28 * 28, 1 << 20) == std::pair<int64_t, int64_t>{56, 56}));  // 1.5 -> 2 (even)
  CHECK((smart_resize(70, 70, 28, 28 * 28, 1 << 20) == std::pair<int64_t, int64_t>{56, 56}));  // 2.5 -> 2 (even)
  CHECK((smart_resize(4000, 3000, 28, 3136, 1003520) == std::pair<int64_t, int64_t>{1148, 840}));
  CHECK_THROWS_WITH_AS(smart_resize(1, 300, 28, 3136, 12544), doctest::Contains("aspect ratio"), ax::UsageError);
}

TEST_CASE("mm_cpt processor: decoded pixels equal PIL's (JPEG, PNG, WebP, alpha over white, grey, palette, EXIF 6)") {
  auto g = goldens();
  int64_t worst = 0;
  for (const auto& name : image_names()) {
    CAPTURE(name);
    Image img = decode_image_file(kData + "/images/" + name, DecodeLimits{});
    at::Tensor want = g->get("decoded." + name);
    REQUIRE(want.size(0) == img.height);
    REQUIRE(want.size(1) == img.width);
    at::Tensor got = at::from_blob(img.rgb.data(), {img.height, img.width, 3}, at::kByte).to(at::kInt);
    const int64_t d = (got - want.to(at::kInt)).abs().max().item<int64_t>();
    worst = std::max(worst, d);
    CHECK(d == 0);
  }
  MESSAGE("decoded pixels: max abs diff vs PIL = " << worst);
}

// Every setting of a goldens file (its metadata: [min_pixels, max_pixels], or an object of Qwen2VLImageProcessor's
// keyword arguments) on every committed image.
void check_processor_goldens(const std::string& file) {
  auto g = ax::safetensors::File::open(kData + "/" + file);
  double worst = 0;
  REQUIRE_FALSE(g->metadata().empty());
  for (const auto& [setting, value] : g->metadata()) {
    if (setting == "format") continue;
    CAPTURE(setting);
    auto kw = nlohmann::json::parse(value);
    ProcessorConfig cfg;
    if (kw.is_array()) kw = {{"min_pixels", kw[0]}, {"max_pixels", kw[1]}};
    cfg.min_pixels = kw.at("min_pixels").get<int64_t>();
    cfg.max_pixels = kw.at("max_pixels").get<int64_t>();
    cfg.patch_size = kw.value("patch_size", cfg.patch_size);
    cfg.image_mean = kw.value("image_mean", cfg.image_mean);
    cfg.image_std = kw.value("image_std", cfg.image_std);
    std::vector<Image> imgs;
    std::vector<at::Tensor> want_pv, want_grid;
    for (const auto& name : image_names()) {
      CAPTURE(name);
      // The processor's input is the golden's decoded pixels, so this case measures the processor alone.
      at::Tensor px = goldens()->get("decoded." + name).contiguous();
      Image img;
      img.height = px.size(0);
      img.width = px.size(1);
      img.rgb.assign(px.data_ptr<uint8_t>(), px.data_ptr<uint8_t>() + px.numel());
      ProcessedImage one = process_image(img, cfg);
      at::Tensor pv = g->get("pixel_values." + setting + "." + name);
      at::Tensor grid = g->get("grid." + setting + "." + name);
      REQUIRE(one.pixel_values.sizes() == pv.sizes());
      CHECK(grid[0][0].item<int64_t>() == one.grid_t);
      CHECK(grid[0][1].item<int64_t>() == one.grid_h);
      CHECK(grid[0][2].item<int64_t>() == one.grid_w);
      const double d = (one.pixel_values - pv).abs().max().item<double>();
      worst = std::max(worst, d);
      CHECK(d <= 1e-5);
      imgs.push_back(std::move(img));
      want_pv.push_back(pv);
      want_grid.push_back(grid);
    }
    // The parallel batch path gives the same, concatenated in order.
    ProcessedBatch b = process_images(imgs, cfg);
    CHECK(at::equal(b.image_grid_thw, at::cat(want_grid, 0)));
    CHECK((b.pixel_values - at::cat(want_pv, 0)).abs().max().item<double>() <= 1e-5);
  }
  MESSAGE(file << ": pixel_values max abs diff vs transformers' fast processor = " << worst);
}

TEST_CASE("mm_cpt processor: pixel_values and image_grid_thw equal transformers' fast processor") {
  check_processor_goldens("processor_goldens.safetensors");
}

// Qwen3-VL's settings: patch 16 (smart_resize to multiples of 32), mean and std 0.5.
TEST_CASE("mm_cpt processor: pixel_values and image_grid_thw equal transformers' with Qwen3-VL's settings") {
  check_processor_goldens("processor_goldens_qwen3_vl.safetensors");
}

TEST_CASE("mm_cpt processor: the fingerprint changes with every setting that changes the output") {
  ProcessorConfig a, b;
  CHECK(a.fingerprint() == b.fingerprint());
  b.max_pixels += 28 * 28;
  CHECK(a.fingerprint() != b.fingerprint());
  ProcessorConfig c;
  c.image_mean[1] = 0.5;
  CHECK(a.fingerprint() != c.fingerprint());
  ProcessorConfig bad;
  bad.min_pixels = bad.max_pixels + 1;
  CHECK_THROWS_AS(bad.validate(), ax::UsageError);
}
