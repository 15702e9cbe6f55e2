// The images of core's chat_template rows (axengine/chat_media.hpp), by the kind of image processor the model's
// family names (DatasetContext::image_processor; no model_type is read here):
// "qwen2_vl" (transformers' Qwen2VLImageProcessor, which Qwen2.5-VL and Qwen3-VL read, each with its own
// preprocessor_config.json: Qwen3-VL's patch 16, mean / std 0.5): the chat template writes
// <|vision_start|><|image_pad|><|vision_end|> per image, and transformers' processor replaces each <|image_pad|>
// with grid_t·grid_h·grid_w / merge_size² of them (Qwen2VLProcessor.__call__); the grid comes from the image's
// header (smart_resize of its size), the pixels from the C++ processor (processor.hpp).
// "gemma3" (Gemma3ImageProcessor): the template writes <start_of_image> per image, which Gemma3Processor replaces
// with "\n\n<start_of_image>" + mm_tokens_per_image × <image_soft_token> + "<end_of_image>\n\n"; every image is
// resized to the processor's fixed size (pixel_values [n, 3, H, W]).
#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"
#include "mm_dataset.hpp"

namespace ax::mm {
namespace {

class QwenVlChatImages final : public ChatImageProcessor {
 public:
  QwenVlChatImages(ProcessorConfig pc, DecodeLimits limits, std::vector<int32_t> ids)
      : pc_(std::move(pc)), limits_(limits), ids_(std::move(ids)) {}

  std::string image_marker() const override { return "<|image_pad|>"; }

  std::string expand(const std::string& file) const override {
    const ProcessedImage g = grid(file);
    std::string out;
    for (int64_t t = 0; t < g.tokens(pc_.merge_size); ++t) out += "<|image_pad|>";
    return out;
  }

  std::vector<int32_t> image_token_ids() const override { return ids_; }

  void add_extras(const std::vector<std::string>& files, Sample& s) const override {
    std::vector<ProcessedImage> grids;
    for (const auto& f : files) grids.push_back(grid(f));
    s.extras["image_grid_thw"] = grid_tensor(grids);
    s.extras["pixel_values"] = decode_and_process(files, grids, pc_, limits_);
  }

 private:
  ProcessedImage grid(const std::string& file) const {
    const ImageHeader h = read_image_header_file(file, limits_);
    try {
      return image_grid(h.height, h.width, pc_);
    } catch (const UsageError& e) {
      throw UsageError(ax::str(file, ": ", e.what()));
    }
  }

  ProcessorConfig pc_;
  DecodeLimits limits_;
  std::vector<int32_t> ids_;  // vision start, vision end, image pad
};

class Gemma3ChatImages final : public ChatImageProcessor {
 public:
  Gemma3ChatImages(Gemma3ProcessorConfig pc, DecodeLimits limits, int64_t tokens, std::vector<int32_t> ids)
      : pc_(std::move(pc)), limits_(limits), tokens_(tokens), ids_(std::move(ids)) {}

  std::string image_marker() const override { return "<start_of_image>"; }

  std::string expand(const std::string& file) const override {
    read_image_header_file(file, limits_);  // a missing or unreadable image is named now, not at decode
    std::string out = "\n\n<start_of_image>";
    for (int64_t t = 0; t < tokens_; ++t) out += "<image_soft_token>";
    return out + "<end_of_image>\n\n";
  }

  std::vector<int32_t> image_token_ids() const override { return ids_; }

  void add_extras(const std::vector<std::string>& files, Sample& s) const override {
    std::vector<at::Tensor> pv;
    for (const auto& f : files) {
      count_image_decode();
      Image img = decode_image_file(f, limits_);
      try {
        pv.push_back(process_gemma3_image(img, pc_));
      } catch (const UsageError& e) {
        throw UsageError(ax::str(f, ": ", e.what()));
      }
    }
    s.extras["pixel_values"] = at::stack(pv);
  }

 private:
  Gemma3ProcessorConfig pc_;
  DecodeLimits limits_;
  int64_t tokens_;
  std::vector<int32_t> ids_;  // start of image, end of image, image soft token
};

// Gemma3ImageProcessor's settings in the model dir's preprocessor_config.json (its defaults without one); what
// this processor does not implement is refused by name.
Gemma3ProcessorConfig gemma3_processor(const std::string& model_dir) {
  Gemma3ProcessorConfig p;
  const std::filesystem::path file = std::filesystem::path(model_dir) / "preprocessor_config.json";
  std::error_code ec;
  if (model_dir.empty() || !std::filesystem::exists(file, ec)) return p;
  const std::string src = file.string();
  nlohmann::json j = nlohmann::json::parse(read_regular_file(src), nullptr, false);
  if (!j.is_object()) throw UsageError(ax::str(src, ": not a JSON object"));
  auto set = [&](const nlohmann::json& v, const char* key) {
    return j.contains(key) && !j[key].is_null() && j[key] != v;
  };
  if (set(false, "do_pan_and_scan"))
    throw UsageError(ax::str(src, ": 'do_pan_and_scan' ", j["do_pan_and_scan"].dump(), " is not supported (pan-and-scan crops are not implemented)"));
  for (const char* k : {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"})
    if (set(true, k)) throw UsageError(ax::str(src, ": '", k, "' ", j[k].dump(), " is not supported (only true)"));
  if (set(2, "resample")) throw UsageError(ax::str(src, ": 'resample' ", j["resample"].dump(), " is not supported (only 2, bilinear)"));
  if (j.contains("size") && j["size"].is_object()) {
    const auto& sz = j["size"];
    for (auto [k, out] : {std::pair{"height", &p.height}, std::pair{"width", &p.width}})
      if (sz.contains(k)) {
        if (!sz[k].is_number_integer()) throw UsageError(ax::str(src, ": 'size.", k, "' must be an integer"));
        *out = sz[k].get<int64_t>();
      }
  }
  if (j.contains("rescale_factor") && j["rescale_factor"].is_number()) p.rescale_factor = j["rescale_factor"].get<double>();
  for (auto [key, out] : {std::pair{"image_mean", &p.image_mean}, std::pair{"image_std", &p.image_std}})
    if (j.contains(key) && j[key].is_array()) {
      out->clear();
      for (const auto& v : j[key]) {
        if (!v.is_number()) throw UsageError(ax::str(src, ": '", key, "' must hold numbers"));
        out->push_back(v.get<double>());
      }
    }
  p.validate();
  return p;
}

// The model's mm_tokens_per_image (config.json; Gemma3Config's default 256) and its vision image_size, which the
// processor's size must equal.
std::shared_ptr<const ChatImageProcessor> gemma3_chat_images(const ChatImageOptions& options, const DatasetContext& ctx) {
  if (options.min_pixels || options.max_pixels)
    throw UsageError("min_pixels / max_pixels do not apply to gemma3 (its processor resizes every image to one size)");
  const std::string cfg_path = (std::filesystem::path(ctx.model_dir) / "config.json").string();
  nlohmann::json cfg = nlohmann::json::parse(read_regular_file(cfg_path), nullptr, false);
  if (!cfg.is_object()) throw UsageError(ax::str(cfg_path, ": not a JSON object"));
  const int64_t tokens = cfg.value("mm_tokens_per_image", int64_t(256));
  Gemma3ProcessorConfig pc = gemma3_processor(ctx.model_dir);
  const nlohmann::json vision = cfg.value("vision_config", nlohmann::json::object());
  const int64_t image_size = vision.is_object() ? vision.value("image_size", int64_t(224)) : 224;
  if (pc.height != image_size || pc.width != image_size)
    throw UsageError(ax::str(ctx.model_dir, ": preprocessor_config.json resizes to ", pc.height, "x", pc.width, " but the vision tower takes ",
                             image_size, "x", image_size));
  DecodeLimits limits;  // images of any size are resized: the decoder's own bounds
  const Tokenizer& tok = *ctx.tokenizer;
  std::vector<int32_t> ids{single_token(tok, "<start_of_image>", "boi_token"), single_token(tok, "<end_of_image>", "eoi_token"),
                           single_token(tok, "<image_soft_token>", "image_token")};
  return std::make_shared<Gemma3ChatImages>(std::move(pc), limits, tokens, std::move(ids));
}

}  // namespace

std::vector<std::string> MmCptType::chat_image_processors() const { return {"qwen2_vl", "gemma3"}; }

std::shared_ptr<const ChatImageProcessor> MmCptType::chat_image_processor(const std::string& kind, const ChatImageOptions& options,
                                                                          const DatasetContext& ctx) const {
  if (kind != "qwen2_vl" && kind != "gemma3") return nullptr;
  if (!ctx.tokenizer) throw RuntimeError("chat images without a tokenizer");
  if (kind == "gemma3") return gemma3_chat_images(options, ctx);
  if (options.min_pixels < 0 || options.max_pixels < 0) throw UsageError("min_pixels and max_pixels must be >= 0");
  ProcessorConfig pc = model_processor(ctx.model_dir);
  if (options.min_pixels) pc.min_pixels = options.min_pixels;
  if (options.max_pixels) pc.max_pixels = options.max_pixels;
  pc.validate();
  DecodeLimits limits;
  limits.max_pixels = std::max<int64_t>(64 * pc.max_pixels, 1 << 24);  // mm_cpt's max_decode_pixels default
  const Tokenizer& tok = *ctx.tokenizer;
  std::vector<int32_t> ids{single_token(tok, "<|vision_start|>", "vision_start_token"), single_token(tok, "<|vision_end|>", "vision_end_token"),
                           single_token(tok, "<|image_pad|>", "image_token")};
  return std::make_shared<QwenVlChatImages>(std::move(pc), limits, std::move(ids));
}

}  // namespace ax::mm
