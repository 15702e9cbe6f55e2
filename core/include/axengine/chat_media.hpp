// Images in `chat_template` rows (docs/datasets.md, "Images in conversations"). Core's chat_template type reads
// the rows, renders them with the model's chat template and trains on the assistant turns; how an image becomes
// tokens and pixels is the business of the image processor the model reads, which its family's description names
// by kind (DatasetContext::image_processor: "qwen2_vl" for Qwen2.5-VL / Qwen3-VL / Qwen3-VL-MoE, "gemma3") and a
// plugin implements:
//   - the template writes a marker per image ("<|image_pad|>" in Qwen2-VL's template);
//   - the processor replaces the k-th marker with the k-th image's text (Qwen2.5-VL: the marker repeated
//     grid_t·grid_h·grid_w / merge² times, from the image's header alone; Gemma 3 writes its begin token,
//     256 soft tokens and its end token);
//   - and turns the sample's image files into the extras its model reads (pixel_values, image_grid_thw).
// A plugin's DatasetType that can do this also implements ChatImageSupport; the chat_template type finds it
// among the registry's dataset types with dynamic_cast, so DatasetType is unchanged (as StreamingDatasetType,
// axengine/stream.hpp); its own virtuals are part of the plugin ABI (11.0: a processor kind, not a model_type).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "axengine/dataset.hpp"

namespace ax {

// One opened dataset entry's image processor. Safe to call from several threads at once.
class ChatImageProcessor {
 public:
  virtual ~ChatImageProcessor();
  // What the chat template writes for each image; the k-th occurrence in the rendered text is the k-th image.
  virtual std::string image_marker() const = 0;
  // The text that replaces the image's marker, from the file's header (no pixels decoded). Throws UsageError
  // naming the file for a missing, unreadable, unrecognised or oversized image.
  virtual std::string expand(const std::string& file) const = 0;
  // Ids that never carry loss (the image's own tokens and its start / end tokens): images are inputs.
  virtual std::vector<int32_t> image_token_ids() const = 0;
  // Decodes and processes `files` (the sample's images, in order) into `s.extras`, as the family's model reads
  // them. Throws UsageError naming the file.
  virtual void add_extras(const std::vector<std::string>& files, Sample& s) const = 0;
};

// Per-entry settings the chat_template type passes through (0: the model's preprocessor_config.json).
struct ChatImageOptions {
  int64_t min_pixels = 0, max_pixels = 0;
};

class ChatImageSupport {
 public:
  virtual ~ChatImageSupport();
  // A processor of `kind` (ctx.image_processor) for the model in ctx.model_dir, whose files (its
  // preprocessor_config.json...) give its settings; null when this provider does not implement that kind.
  virtual std::shared_ptr<const ChatImageProcessor> chat_image_processor(const std::string& kind, const ChatImageOptions& options,
                                                                        const DatasetContext& ctx) const = 0;
  // The kinds it implements (for the error naming a kind no loaded plugin implements).
  virtual std::vector<std::string> chat_image_processors() const = 0;
};

}  // namespace ax
