// Decoded images and the decoders (JPEG: libjpeg-turbo, PNG: libpng, WebP: libwebp; no hand-written codec).
// Every decode reads the header first and refuses an image whose pixel count is over the caller's limit
// before any pixel buffer is allocated, so a decompression bomb (a tiny file declaring 60000x60000) costs
// nothing. Errors are ax::UsageError naming the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ax::mm {

// 8-bit RGB, rows top to bottom, interleaved (HWC), as PIL's convert("RGB") gives it.
struct Image {
  int64_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // width * height * 3
};

struct DecodeLimits {
  // Largest width * height accepted from a header (default: 2^28, ~16k x 16k). The dataset derives it from
  // the processor's max_pixels (mm_cpt: max_decode_pixels).
  int64_t max_pixels = int64_t(1) << 28;
  // Largest side; also bounds a degenerate 1 x huge image.
  int64_t max_side = 65535;
};

enum class ImageFormat { unknown, jpeg, png, webp };
ImageFormat sniff_format(const std::uint8_t* data, std::size_t size);  // by magic bytes, not by extension

// Decodes `size` bytes; `name` is the file named in errors. Applies the EXIF orientation of JPEGs (tag
// 0x0112 in APP1, read by exif_orientation) and composites alpha onto white, as transformers' loader does
// (PIL: ImageOps.exif_transpose, then convert_to_rgb).
Image decode_image(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits);
// Reads and decodes a file: missing, unreadable or zero-size files are errors naming it.
Image decode_image_file(const std::string& path, const DecodeLimits& limits);

// What an image's header says, without decoding its pixels: the size decoding gives (after the EXIF orientation,
// which swaps width and height for 5..8), with the checks decoding makes before it allocates (format, size
// limits, CMYK, animation), failing with the same messages. A streamed sample's image tokens are counted from it
// on every data-parallel rank, while only the rank that trains the sample decodes the pixels (mm_dataset.cpp).
struct ImageHeader {
  int64_t width = 0, height = 0;
};
ImageHeader read_image_header(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits);
// Reads the file's header (missing, unreadable or zero-size: errors naming it, as decode_image_file): from its
// first 64 KiB when the header lies there, else from the whole file.
ImageHeader read_image_header_file(const std::string& path, const DecodeLimits& limits);
// The bytes read_image_header_file has read so far in this process (for tests).
std::uint64_t image_header_bytes_read();

// EXIF orientation (1..8) from the TIFF block of an APP1 "Exif\0\0" segment (`tiff` points past that
// header); 1 when absent or malformed. A small bounds-checked reader: every offset is checked against `size`.
int exif_orientation(const std::uint8_t* tiff, std::size_t size);
// Applies orientation 2..8 (EXIF's meaning, as PIL's exif_transpose) to `img`.
void apply_orientation(Image& img, int orientation);

}  // namespace ax::mm
