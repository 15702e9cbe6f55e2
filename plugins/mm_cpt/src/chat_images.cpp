// The images of core's chat_template rows for Qwen2-VL / Qwen2.5-VL / Qwen3-VL models (axengine/chat_media.hpp):
// their chat template writes <|vision_start|><|image_pad|><|vision_end|> per image, and transformers' processor replaces each
// <|image_pad|> with grid_t·grid_h·grid_w / merge_size² of them (Qwen2VLProcessor.__call__); the grid comes from
// the image's header (smart_resize of its size), the pixels from the C++ processor (processor.hpp). Qwen3-VL's
// processor is the same one with its own preprocessor_config.json (patch 16, mean / std 0.5).
#include <algorithm>

#include "axengine/error.hpp"
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

}  // namespace

std::vector<std::string> MmCptType::chat_image_families() const { return {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}; }

std::shared_ptr<const ChatImageProcessor> MmCptType::chat_image_processor(const std::string& model_type,
                                                                          const ChatImageOptions& options,
                                                                          const DatasetContext& ctx) const {
  const auto families = chat_image_families();
  if (std::find(families.begin(), families.end(), model_type) == families.end()) return nullptr;
  if (!ctx.tokenizer) throw RuntimeError("chat images without a tokenizer");
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
