// Qwen2-VL's image processor in C++ (Qwen2.5-VL uses the same one): smart_resize to multiples of
// patch_size * merge_size within [min_pixels, max_pixels], bicubic resize with antialiasing, rescale by 1/255,
// normalise with OpenAI CLIP's mean/std, and patchify into pixel_values [grid_h * grid_w, 3 * 2 * 14 * 14]
// (channel, temporal, row, column; the frame repeated over the temporal patch) plus image_grid_thw [1, h, w].
//
// It matches transformers' fast processor (Qwen2VLImageProcessor, the torchvision backend) step by step: the
// same ATen kernel on the same uint8 pixels (torchvision resizes uint8 natively on the CPU with
// interpolate(mode="bicubic", antialias=True) = at::_upsample_bicubic2d_aa; we hand it the decoded HWC bytes as a
// channels-last view, which its integer arithmetic gives the same bits for without the CHW copy and repacking),
// then (x - 255 mean) / (255 std) in float32 as its fused rescale-and-normalise does. The PIL backend resizes with PIL's own filter and is
// not what transformers uses by default.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "image.hpp"

namespace ax::mm {

struct ProcessorConfig {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  std::vector<double> image_mean{0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::vector<double> image_std{0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
  // What changes the output; keys the prepared-data cache next to the dataset entry.
  std::string fingerprint() const;
  // Throws UsageError for an unusable combination (min > max, zero sizes, 3 values each for mean/std).
  void validate() const;
};

// transformers' smart_resize(height, width, factor, min_pixels, max_pixels): (height, width), with Python's
// round-half-to-even. Throws UsageError when the aspect ratio is over 200.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels);

struct ProcessedImage {
  at::Tensor pixel_values;  // float32 [grid_h * grid_w, 3 * temporal * patch * patch]
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;
  int64_t tokens(int64_t merge_size) const { return grid_t * grid_h * grid_w / (merge_size * merge_size); }
};

// The grid process_image gives an image of height x width (no pixels: pixel_values undefined): its token
// count is known from the image's header alone (read_image_header).
ProcessedImage image_grid(int64_t height, int64_t width, const ProcessorConfig& cfg);

// One image. Safe to call from several threads; ATen's own intra-op threading is kept out of the way
// (each call runs its kernels on the calling thread, see SerialAten) so that callers parallelise over images.
ProcessedImage process_image(const Image& img, const ProcessorConfig& cfg);

// Many images in parallel (oneTBB), concatenated in order: pixel_values [sum patches, 1176], grid [n, 3].
struct ProcessedBatch {
  at::Tensor pixel_values, image_grid_thw;
};
ProcessedBatch process_images(const std::vector<Image>& images, const ProcessorConfig& cfg);
ProcessedBatch concat(const std::vector<ProcessedImage>& parts, int64_t patch_dim);

// Gemma 3's image processor (Gemma3ImageProcessor, the torchvision backend; pan-and-scan off): every image resized
// to height x width (bilinear with antialiasing on the uint8 CHW tensor, at::_upsample_bilinear2d_aa as
// torchvision runs it), then the same fused rescale-and-normalise (mean and std 0.5 by default).
struct Gemma3ProcessorConfig {
  int64_t height = 224, width = 224;
  double rescale_factor = 1.0 / 255.0;
  std::vector<double> image_mean{0.5, 0.5, 0.5};  // IMAGENET_STANDARD_MEAN
  std::vector<double> image_std{0.5, 0.5, 0.5};   // IMAGENET_STANDARD_STD
  std::string fingerprint() const;
  void validate() const;
};
// One image: float32 [3, height, width]. Safe to call from several threads, as process_image.
at::Tensor process_gemma3_image(const Image& img, const Gemma3ProcessorConfig& cfg);

}  // namespace ax::mm
