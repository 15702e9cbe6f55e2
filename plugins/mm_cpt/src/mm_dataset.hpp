// The `mm_cpt` dataset type: image + text rows for multimodal continued pre-training of Qwen2-VL-style models
// (docs/plugins/mm_cpt.md). Two row forms (`rows`):
//   raw        {"text": "a cat <image> on a mat", "images": "cat.jpg"}: each placeholder becomes
//              <|vision_start|> <|image_pad|> x (t*h*w / merge^2) <|vision_end|>, the text is tokenised;
//   tokenized  {"_mm_text": ..., "images": [...], "input_ids": [...], "attention_mask": [...], "labels": [...]}:
//              ids passed through, checked against the images' token counts.
// Samples carry extras "pixel_values" float32 [patches, 1176] (the sample's images in order) and
// "image_grid_thw" int64 [images, 3]; collate() concatenates both over a batch's samples in layout order.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "axengine/chat_media.hpp"
#include "axengine/dataset.hpp"
#include "axengine/registry.hpp"
#include "axengine/stream.hpp"
#include "image.hpp"
#include "processor.hpp"

namespace ax::mm {

// Images decoded by this process (every decode_image_file of the type): the tests prove that a cached
// prepare decodes nothing.
std::uint64_t image_decodes();
void count_image_decode();  // one more for image_decodes()

// Adds the `mm_cpt` dataset type to `registry` by hand, as the plugin's registration does: for the tests and fuzz
// harnesses that build a registry (or an engine without plugin discovery) in-process.
void add_mm_cpt_type(Registry& registry);

// The processor settings of the model dir's preprocessor_config.json (transformers' defaults without one).
ProcessorConfig model_processor(const std::string& model_dir);
// The id of `text`, which must be one token of `tok` (`key` names the setting in the error).
int32_t single_token(const ax::Tokenizer& tok, const std::string& text, const char* key);
// image_grid_thw [n, 3] of the grids.
at::Tensor grid_tensor(const std::vector<ProcessedImage>& images);
// Decodes and processes `files` in order into pixel_values [patches, C·T·P·P], each image checked against the
// grid its header gave (`grids`); counted by image_decodes().
at::Tensor decode_and_process(const std::vector<std::string>& files, const std::vector<ProcessedImage>& grids,
                              const ProcessorConfig& pc, const DecodeLimits& limits);

// Streams too (streaming = true): rows read from JSON Lines shards as training goes, each row's images decoded
// only when the row is read. Also processes the images of core's chat_template rows, implementing the image
// processor kinds "qwen2_vl" and "gemma3" (ChatImageSupport, chat_images.cpp).
class MmCptType final : public DatasetType, public StreamingDatasetType, public ChatImageSupport {
 public:
  std::vector<std::string> known_keys() const override;
  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override;
  std::unique_ptr<SampleStream> open_stream(const toml::table& entry, const DatasetContext& ctx) const override;
  std::map<std::string, at::Tensor> collate(const BatchLayout& layout) const override;
  std::shared_ptr<const ChatImageProcessor> chat_image_processor(const std::string& kind, const ChatImageOptions& options,
                                                                const DatasetContext& ctx) const override;
  std::vector<std::string> chat_image_processors() const override;

 private:
  // The image token of the last opened entry, to refuse a batch that cuts a sample inside its image tokens.
  mutable std::atomic<int32_t> image_token_id_{-1};
};

}  // namespace ax::mm
