#include "processor.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

#include <dlfcn.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <tbb/parallel_for.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::mm {
namespace {

// ATen (the torch wheel) parallelises its kernels with OpenMP, whose thread count is per calling thread.
// Called from oneTBB workers that already run one image each, every kernel would start its own OpenMP team
// (threads x threads on a 16-core host), so for the length of one image the calling thread's OpenMP count
// is set to 1 and restored after. The functions are looked up in the process (torch's own libgomp, which a
// plugin does not link directly); without OpenMP they are absent and this does nothing.
class SerialAten {
 public:
  SerialAten() {
    static const auto set = reinterpret_cast<void (*)(int)>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    static const auto get = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (!set || !get) return;
    at::get_num_threads();  // ATen's lazy per-thread initialisation first, or it would overwrite ours
    set_ = set;
    saved_ = get();
    if (saved_ != 1) set_(1);
  }
  ~SerialAten() {
    if (set_ && saved_ != 1) set_(saved_);
  }
  SerialAten(const SerialAten&) = delete;
  SerialAten& operator=(const SerialAten&) = delete;

 private:
  void (*set_)(int) = nullptr;
  int saved_ = 1;
};

}  // namespace

std::string ProcessorConfig::fingerprint() const {
  std::ostringstream os;
  os.precision(17);
  os << "qwen2_vl_fast v1 min " << min_pixels << " max " << max_pixels << " patch " << patch_size << " t "
     << temporal_patch_size << " merge " << merge_size << " mean";
  for (double m : image_mean) os << ' ' << m;
  os << " std";
  for (double s : image_std) os << ' ' << s;
  return os.str();
}

void ProcessorConfig::validate() const {
  if (patch_size <= 0 || merge_size <= 0 || temporal_patch_size <= 0)
    throw UsageError("image processor: patch_size, merge_size and temporal_patch_size must be positive");
  if (min_pixels <= 0 || max_pixels <= 0 || min_pixels > max_pixels)
    throw UsageError(ax::str("image processor: need 0 < min_pixels <= max_pixels (got ", min_pixels, ", ", max_pixels, ")"));
  if (image_mean.size() != 3 || image_std.size() != 3)
    throw UsageError("image processor: image_mean and image_std need 3 values (R, G, B)");
  for (double s : image_std)
    if (!(s > 0)) throw UsageError("image processor: image_std values must be positive");
}

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels) {
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  if (std::max(h, w) / std::min(h, w) > 200)
    throw UsageError(ax::str("image of ", width, "x", height, ": absolute aspect ratio must be smaller than 200"));
  // Python's round() rounds half to even, as nearbyint does in the default rounding mode.
  int64_t hb = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t wb = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (hb * wb > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    hb = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    wb = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (hb * wb < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    hb = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    wb = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {hb, wb};
}

ProcessedImage image_grid(int64_t height, int64_t width, const ProcessorConfig& cfg) {
  auto [rh, rw] = smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels);
  ProcessedImage out;
  out.grid_h = rh / cfg.patch_size;
  out.grid_w = rw / cfg.patch_size;
  return out;
}

namespace {

// The image as uint8 [1, 3, H, W] in channels-last strides over its own HWC bytes: a view, no copy.
at::Tensor nchw_view(const Image& img) {
  if (img.width <= 0 || img.height <= 0 || img.rgb.size() != static_cast<std::size_t>(img.width * img.height * 3))
    throw UsageError("image processor: an empty or inconsistent image");
  return at::from_blob(const_cast<std::uint8_t*>(img.rgb.data()), {1, img.height, img.width, 3}, at::kByte).permute({0, 3, 1, 2});
}

// The image resized to h x w by ATen's uint8 antialiased kernel (bicubic or bilinear), as HWC bytes: [1, h, w, 3],
// contiguous (the image's own bytes when no resize is needed). transformers' torchvision backend calls the same
// kernel on a contiguous CHW tensor; given channels-last input it skips its CHW <-> RGBA repacking and writes
// channels-last output, with the same integer arithmetic per channel (same bits: processor_test.cpp checks it
// against the CHW composition). The caller holds SerialAten.
at::Tensor resized_hwc(const Image& img, int64_t h, int64_t w, bool bicubic) {
  at::Tensor x = nchw_view(img);
  if (h != img.height || w != img.width)
    x = bicubic ? at::_upsample_bicubic2d_aa(x, {h, w}, /*align_corners=*/false, std::nullopt, std::nullopt)
                : at::_upsample_bilinear2d_aa(x, {h, w}, /*align_corners=*/false, std::nullopt, std::nullopt);
  return x.permute({0, 2, 3, 1}).contiguous();  // no copy unless ATen chose another layout (a 1-pixel side)
}

// transformers' fused rescale + normalise: (x - mean') / std' in float32, where mean' and std' are the float32
// mean and std times 1 / rescale_factor.
struct Normalise {
  float mean[3], stdv[3];
  Normalise(const std::vector<double>& mean_in, const std::vector<double>& std_in, double rescale) {
    const double inv_rescale = 1.0 / rescale;
    for (int c = 0; c < 3; ++c) {
      mean[c] = static_cast<float>(static_cast<float>(mean_in[c]) * inv_rescale);
      stdv[c] = static_cast<float>(static_cast<float>(std_in[c]) * inv_rescale);
    }
  }
  float operator()(int c, std::uint8_t v) const { return (static_cast<float>(v) - mean[c]) / stdv[c]; }
};

// Interleaved RGB bytes to the three normalised float planes in one pass: the same IEEE operations per value as
// Normalise::operator() (a subtraction and a true division: no contraction or reciprocal without -ffast-math),
// vectorised by the compiler. Its stride-3 byte loads vectorise well only with AVX2's shuffles (0.3 ms for
// 896 x 896 against 2 ms with SSE2 alone), so on x86-64 an AVX2 clone is chosen at load time where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
void normalise_planes(const std::uint8_t* __restrict px, int64_t n, const Normalise& norm, float* __restrict r,
                      float* __restrict g, float* __restrict b) {
  const float m0 = norm.mean[0], m1 = norm.mean[1], m2 = norm.mean[2];
  const float s0 = norm.stdv[0], s1 = norm.stdv[1], s2 = norm.stdv[2];
  for (int64_t i = 0; i < n; ++i) {
    r[i] = (static_cast<float>(px[3 * i]) - m0) / s0;
    g[i] = (static_cast<float>(px[3 * i + 1]) - m1) / s1;
    b[i] = (static_cast<float>(px[3 * i + 2]) - m2) / s2;
  }
}

}  // namespace

ProcessedImage process_image(const Image& img, const ProcessorConfig& cfg) {
  SerialAten serial;  // the caller (a oneTBB task per image) is the parallelism
  const int64_t factor = cfg.patch_size * cfg.merge_size;
  auto [rh, rw] = smart_resize(img.height, img.width, factor, cfg.min_pixels, cfg.max_pixels);
  const at::Tensor hwc = resized_hwc(img, rh, rw, /*bicubic=*/true);
  const std::uint8_t* px = hwc.data_ptr<std::uint8_t>();

  // Normalise tabulated for the 256 byte values of each channel: the patches' short rows gather, not stream.
  const Normalise norm(cfg.image_mean, cfg.image_std, 1.0 / 255.0);
  float table[3][256];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) table[c][v] = norm(c, static_cast<std::uint8_t>(v));
  const int64_t P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
  const int64_t gh = rh / P, gw = rw / P;
  const int64_t dim = 3 * T * P * P;
  ProcessedImage out;
  out.grid_h = gh;
  out.grid_w = gw;
  out.pixel_values = at::empty({gh * gw, dim}, at::kFloat);
  float* dst = out.pixel_values.data_ptr<float>();
  // transformers' patchify: patches ordered (block row, block col, row in block, col in block), each patch
  // (channel, temporal copy, y, x).
  int64_t patch = 0;
  for (int64_t bh = 0; bh < gh / M; ++bh)
    for (int64_t bw = 0; bw < gw / M; ++bw)
      for (int64_t mh = 0; mh < M; ++mh)
        for (int64_t mw = 0; mw < M; ++mw, ++patch) {
          const int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          float* p = dst + patch * dim;
          for (int64_t c = 0; c < 3; ++c) {
            float* first = p + c * T * P * P;
            for (int64_t y = 0; y < P; ++y) {
              const std::uint8_t* row = px + ((y0 + y) * rw + x0) * 3 + c;
              for (int64_t xx = 0; xx < P; ++xx) first[y * P + xx] = table[c][row[xx * 3]];
            }
            for (int64_t t = 1; t < T; ++t) std::memcpy(first + t * P * P, first, sizeof(float) * P * P);
          }
        }
  return out;
}

std::string Gemma3ProcessorConfig::fingerprint() const {
  std::ostringstream os;
  os.precision(17);
  os << "gemma3_fast v1 " << height << "x" << width << " rescale " << rescale_factor << " mean";
  for (double m : image_mean) os << ' ' << m;
  os << " std";
  for (double s : image_std) os << ' ' << s;
  return os.str();
}

void Gemma3ProcessorConfig::validate() const {
  if (height <= 0 || width <= 0 || height > 8192 || width > 8192)
    throw UsageError(ax::str("image processor: size must be in [1, 8192] a side, got ", height, "x", width));
  if (!(rescale_factor > 0)) throw UsageError("image processor: rescale_factor must be positive");
  if (image_mean.size() != 3 || image_std.size() != 3) throw UsageError("image processor: image_mean and image_std need 3 values (R, G, B)");
  for (double s : image_std)
    if (!(s > 0)) throw UsageError("image processor: image_std values must be positive");
}

at::Tensor process_gemma3_image(const Image& img, const Gemma3ProcessorConfig& cfg) {
  SerialAten serial;
  const at::Tensor hwc = resized_hwc(img, cfg.height, cfg.width, /*bicubic=*/false);
  const std::uint8_t* px = hwc.data_ptr<std::uint8_t>();
  const int64_t n = cfg.height * cfg.width;
  at::Tensor out = at::empty({3, cfg.height, cfg.width}, at::kFloat);
  float* r = out.data_ptr<float>();
  normalise_planes(px, n, Normalise(cfg.image_mean, cfg.image_std, cfg.rescale_factor), r, r + n, r + 2 * n);
  return out;
}

ProcessedBatch concat(const std::vector<ProcessedImage>& parts, int64_t patch_dim) {
  ProcessedBatch b;
  std::vector<at::Tensor> pv;
  b.image_grid_thw = at::empty({static_cast<int64_t>(parts.size()), 3}, at::kLong);
  auto g = b.image_grid_thw.accessor<int64_t, 2>();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    pv.push_back(parts[i].pixel_values);
    g[i][0] = parts[i].grid_t;
    g[i][1] = parts[i].grid_h;
    g[i][2] = parts[i].grid_w;
  }
  b.pixel_values = pv.empty() ? at::empty({0, patch_dim}, at::kFloat) : at::cat(pv, 0);
  return b;
}

ProcessedBatch process_images(const std::vector<Image>& images, const ProcessorConfig& cfg) {
  std::vector<ProcessedImage> parts(images.size());
  tbb::parallel_for(std::size_t(0), images.size(), [&](std::size_t i) { parts[i] = process_image(images[i], cfg); });
  return concat(parts, 3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size);
}

}  // namespace ax::mm
