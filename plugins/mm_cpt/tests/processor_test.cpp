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

namespace {
// What transformers' torchvision backend computes, op by op in ATen: the uint8 CHW tensor (contiguous) resized by the
// antialiased kernel, then (x - mean') / std' in float32 with mean' and std' its fused float32 values.
at::Tensor reference_normalised(const Image& img, int64_t h, int64_t w, bool bicubic, const std::vector<double>& mean,
                                const std::vector<double>& stdv) {
  at::Tensor x = at::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3}, at::kByte)
                     .permute({2, 0, 1}).contiguous().unsqueeze(0);
  if (h != img.height || w != img.width)
    x = bicubic ? at::_upsample_bicubic2d_aa(x, {h, w}, false, std::nullopt, std::nullopt)
                : at::_upsample_bilinear2d_aa(x, {h, w}, false, std::nullopt, std::nullopt);
  at::Tensor m = at::empty({1, 3, 1, 1}, at::kFloat), s = at::empty({1, 3, 1, 1}, at::kFloat);
  for (int c = 0; c < 3; ++c) {
    m.view(-1)[c] = static_cast<float>(static_cast<float>(mean[c]) * (1.0 / (1.0 / 255.0)));
    s.view(-1)[c] = static_cast<float>(static_cast<float>(stdv[c]) * (1.0 / (1.0 / 255.0)));
  }
  return ((x.to(at::kFloat) - m) / s).squeeze(0);
}

Image random_image(int64_t h, int64_t w, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor px = at::randint(0, 256, {h, w, 3}, at::kByte);
  Image img;
  img.height = h;
  img.width = w;
  img.rgb.assign(px.data_ptr<uint8_t>(), px.data_ptr<uint8_t>() + px.numel());
  return img;
}

const std::vector<std::pair<int64_t, int64_t>> kSizes{{480, 640}, {37, 53}, {1, 5}, {6, 1}, {224, 224}, {1003, 901}};
}  // namespace

// The processors resize the decoded HWC bytes in place of a CHW copy (ATen's kernel then skips its repacking) and
// normalise in one fused pass; the bits must be those of the op-by-op composition, on sizes up and down, a 1-pixel
// side and no resize at all.
TEST_CASE("mm_cpt processor: Gemma 3's fused path equals the op-by-op ATen composition bit for bit") {
  Gemma3ProcessorConfig pc;
  for (int64_t side : {224, 64}) {
    pc.height = side;
    pc.width = side + 32;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const auto [h, w] = kSizes[i];
      CAPTURE(h);
      CAPTURE(w);
      CAPTURE(side);
      const Image img = random_image(h, w, 7 + i);
      const at::Tensor want = reference_normalised(img, pc.height, pc.width, false, pc.image_mean, pc.image_std);
      CHECK(at::equal(process_gemma3_image(img, pc), want));
    }
  }
}

TEST_CASE("mm_cpt processor: Qwen-VL's fused patchify equals the op-by-op ATen composition bit for bit") {
  ProcessorConfig qwen3;
  qwen3.patch_size = 16;
  qwen3.image_mean = qwen3.image_std = {0.5, 0.5, 0.5};
  for (const ProcessorConfig& cfg : {ProcessorConfig{}, qwen3}) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const auto [h, w] = kSizes[i];
      if (std::max(h, w) / std::min(h, w) > 200) continue;
      CAPTURE(h);
      CAPTURE(w);
      const Image img = random_image(h, w, 11 + i);
      const int64_t P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
      const auto [rh, rw] = smart_resize(h, w, P * M, cfg.min_pixels, cfg.max_pixels);
      const at::Tensor x = reference_normalised(img, rh, rw, true, cfg.image_mean, cfg.image_std);
      // transformers' patchify: the frame repeated over the temporal patch, patches in (block, row, column) order.
      const at::Tensor want = x.unsqueeze(0).expand({T, 3, rh, rw})
                                  .reshape({T, 3, rh / P / M, M, P, rw / P / M, M, P})
                                  .permute({2, 5, 3, 6, 1, 0, 4, 7})
                                  .reshape({rh / P * (rw / P), 3 * T * P * P});
      CHECK(at::equal(process_image(img, cfg).pixel_values, want));
    }
  }
}
