// Image files of the mm_cpt plugin (plugins/mm_cpt/src/image.cpp: JPEG, PNG, WebP through their libraries,
// our EXIF reader and the header size limit), decoded and processed as a dataset row's image is. The first
// input byte picks the target: even = the whole file through decode + process (and its header alone, which must
// agree with the decode, and the header of a prefix as long as the last byte says, which must fail or agree),
// odd = the EXIF TIFF block.
#include <cstdlib>
#include <optional>

#include <tbb/global_control.h>

#include "axengine/error.hpp"
#include "harness.hpp"
#include "image.hpp"
#include "processor.hpp"

AX_FUZZ_HARNESS(mm_image_decode) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  if (size == 0) return;
  const std::uint8_t* body = data + 1;
  const std::size_t n = size - 1;
  if (data[0] & 1) {
    const int o = ax::mm::exif_orientation(body, n);
    if (o < 1 || o > 8) std::abort();
    return;
  }
  ax::mm::DecodeLimits limits;
  limits.max_pixels = 1 << 20;  // a fuzzer's header may declare anything: keep the allocations small
  // The header alone (what a streamed sample's image tokens are counted from, on every rank) must agree with
  // decoding: an image that decodes has a header that reads, giving the decoded size.
  std::optional<ax::mm::ImageHeader> header;
  try {
    header = ax::mm::read_image_header(body, n, "fuzz.img", limits);
  } catch (const ax::UsageError&) {
  }
  // read_image_header_file reads a file's first bytes first and keeps that answer when the header reads from
  // them: a prefix's header, when it reads, must be the whole input's (a prefix too short must fail instead).
  const std::size_t cut = n * data[size - 1] / 255;
  try {
    const ax::mm::ImageHeader h = ax::mm::read_image_header(body, cut, "fuzz.img", limits);
    if (!header || header->width != h.width || header->height != h.height) std::abort();
  } catch (const ax::UsageError&) {
  }
  ax::mm::Image img = ax::mm::decode_image(body, n, "fuzz.img", limits);
  if (img.width <= 0 || img.height <= 0 || img.width * img.height > limits.max_pixels ||
      img.rgb.size() != static_cast<std::size_t>(img.width * img.height * 3))
    std::abort();
  if (!header || header->width != img.width || header->height != img.height) std::abort();
  ax::mm::ProcessorConfig cfg;
  cfg.min_pixels = 28 * 28;
  cfg.max_pixels = 28 * 28 * 4;
  auto p = ax::mm::process_image(img, cfg);
  if (p.pixel_values.size(0) != p.grid_h * p.grid_w || p.pixel_values.size(1) != 1176) std::abort();
}
