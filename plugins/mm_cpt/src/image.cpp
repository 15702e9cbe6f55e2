#include "image.hpp"

#include <algorithm>
#include <atomic>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"

namespace ax::mm {
namespace {

// "" when the header's size is acceptable, else the refusal.
std::string size_problem(int64_t w, int64_t h, const std::string& name, const DecodeLimits& limits) {
  if (w <= 0 || h <= 0) return ax::str(name, ": the image header declares an empty image (", w, "x", h, ")");
  if (w > limits.max_side || h > limits.max_side || w * h > limits.max_pixels)
    return ax::str(name, ": the image header declares ", w, "x", h, " = ", w * h, " pixels, over the limit of ",
                   limits.max_pixels, " pixels (side ", limits.max_side,
                   "); refused before decoding (a decompression bomb, or raise max_decode_pixels)");
  return "";
}
void check_size(int64_t w, int64_t h, const std::string& name, const DecodeLimits& limits) {
  std::string problem = size_problem(w, h, name, limits);
  if (!problem.empty()) throw UsageError(problem);
}

// PIL's alpha_composite of the pixel over opaque white (libImaging/AlphaComposite.c with dst = 255), so a
// transparent PNG/WebP gives the bytes transformers' convert_to_rgb gives.
inline std::uint8_t over_white(std::uint32_t c, std::uint32_t a) {
  if (a == 0) return 255;
  constexpr std::uint32_t kBits = 7;
  const std::uint32_t coef1 = a << kBits, coef2 = (255 - a) << kBits;
  std::uint32_t t = c * coef1 + 255 * coef2 + (0x80u << kBits);
  t = ((t >> 8) + t) >> 8;
  return static_cast<std::uint8_t>(t >> kBits);
}

void rgba_to_rgb(const std::uint8_t* rgba, Image& img) {
  const std::size_t n = static_cast<std::size_t>(img.width * img.height);
  img.rgb.resize(n * 3);
  for (std::size_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c) img.rgb[i * 3 + c] = over_white(rgba[i * 4 + c], rgba[i * 4 + 3]);
}

// --- JPEG: libjpeg's errors longjmp back here; no object with a destructor lives across the jump except
// those created before setjmp and never reassigned after it (the state is reached through `st`).
struct JpegState {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr jerr{};
  std::jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {0};
  std::string error;  // set for refusals raised between setjmp points
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* st = reinterpret_cast<JpegState*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, st->message);
  std::longjmp(st->jump, 1);
}
void jpeg_quiet(j_common_ptr, int) {}  // warnings (corrupt-data recoveries) are not printed

// The EXIF orientation of the APP1 markers jpeg_save_markers kept; 1 when none.
int jpeg_orientation(const jpeg_decompress_struct& cinfo) {
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && m->data_length > 6 && std::memcmp(m->data, "Exif\0\0", 6) == 0)
      return exif_orientation(m->data + 6, m->data_length - 6);
  return 1;
}

// Orientations 5..8 transpose the image: decoding gives height x width.
ImageHeader oriented(int64_t w, int64_t h, int orientation) {
  return orientation >= 5 && orientation <= 8 ? ImageHeader{h, w} : ImageHeader{w, h};
}

// Reads a JPEG's header and checks it; with `img`, decodes its pixels into it (oriented), else stops at the
// header (read_image_header: the size after orientation, no pixel buffer). One reader for both, so the header's
// refusals are exactly the decoder's.
ImageHeader read_jpeg(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits,
                      Image* img) {
  auto st = std::make_unique<JpegState>();
  st->cinfo.err = jpeg_std_error(&st->jerr);
  st->jerr.error_exit = jpeg_error_exit;
  st->jerr.emit_message = jpeg_quiet;
  st->cinfo.client_data = st.get();
  if (setjmp(st->jump)) {
    jpeg_destroy_decompress(&st->cinfo);
    if (!st->error.empty()) throw UsageError(st->error);
    throw UsageError(ax::str(name, ": not a decodable JPEG (libjpeg: ", st->message, ")"));
  }
  jpeg_create_decompress(&st->cinfo);
  jpeg_mem_src(&st->cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&st->cinfo, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(&st->cinfo, TRUE);
  st->error = size_problem(st->cinfo.image_width, st->cinfo.image_height, name, limits);
  if (!st->error.empty()) std::longjmp(st->jump, 1);
  if (st->cinfo.jpeg_color_space == JCS_CMYK || st->cinfo.jpeg_color_space == JCS_YCCK) {
    st->error = ax::str(name, ": CMYK JPEGs are not supported (convert the image to RGB)");
    std::longjmp(st->jump, 1);
  }
  const int orientation = jpeg_orientation(st->cinfo);
  // Unscaled output: jpeg_start_decompress gives output_width x output_height = image_width x image_height.
  const ImageHeader header = oriented(st->cinfo.image_width, st->cinfo.image_height, orientation);
  if (img == nullptr) {
    jpeg_destroy_decompress(&st->cinfo);
    return header;
  }
  st->cinfo.out_color_space = JCS_RGB;  // grey and YCbCr alike, as PIL's convert("RGB")
  jpeg_start_decompress(&st->cinfo);
  img->width = st->cinfo.output_width;
  img->height = st->cinfo.output_height;
  img->rgb.resize(static_cast<std::size_t>(img->width * img->height * 3));
  while (st->cinfo.output_scanline < st->cinfo.output_height) {
    JSAMPROW row = img->rgb.data() + static_cast<std::size_t>(st->cinfo.output_scanline) * img->width * 3;
    jpeg_read_scanlines(&st->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&st->cinfo);
  jpeg_destroy_decompress(&st->cinfo);
  apply_orientation(*img, orientation);
  return header;
}

Image decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits) {
  auto img = std::make_unique<Image>();  // on the heap: nothing of the frame setjmp saved changes under longjmp
  read_jpeg(data, size, name, limits, img.get());
  return std::move(*img);
}

// --- PNG: libpng's simplified API (no setjmp here; it reports failures in image.message).
Image decode_png(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, data, size))
    throw UsageError(ax::str(name, ": not a decodable PNG (libpng: ", png.message, ")"));
  struct Guard {
    png_image* p;
    ~Guard() { png_image_free(p); }
  } guard{&png};
  check_size(png.width, png.height, name, limits);
  const bool alpha = (png.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  png.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  Image img;
  img.width = png.width;
  img.height = png.height;
  std::vector<std::uint8_t> buf(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, buf.data(), 0, nullptr))
    throw UsageError(ax::str(name, ": not a decodable PNG (libpng: ", png.message, ")"));
  if (alpha)
    rgba_to_rgb(buf.data(), img);
  else
    img.rgb = std::move(buf);
  return img;
}

Image decode_webp(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(data, size, &f) != VP8_STATUS_OK) throw UsageError(ax::str(name, ": not a decodable WebP"));
  if (f.has_animation) throw UsageError(ax::str(name, ": animated WebP is not supported"));
  check_size(f.width, f.height, name, limits);
  Image img;
  img.width = f.width;
  img.height = f.height;
  const std::size_t n = static_cast<std::size_t>(img.width * img.height);
  if (f.has_alpha) {
    std::vector<std::uint8_t> rgba(n * 4);
    if (!WebPDecodeRGBAInto(data, size, rgba.data(), rgba.size(), static_cast<int>(img.width * 4)))
      throw UsageError(ax::str(name, ": not a decodable WebP (corrupt data)"));
    rgba_to_rgb(rgba.data(), img);
  } else {
    img.rgb.resize(n * 3);
    if (!WebPDecodeRGBInto(data, size, img.rgb.data(), img.rgb.size(), static_cast<int>(img.width * 3)))
      throw UsageError(ax::str(name, ": not a decodable WebP (corrupt data)"));
  }
  return img;
}

// Bounds-checked little/big-endian reads of the TIFF block.
struct Tiff {
  const std::uint8_t* p;
  std::size_t n;
  bool big;
  bool u16(std::size_t at, std::uint32_t& v) const {
    if (at > n || n - at < 2) return false;
    v = big ? (p[at] << 8 | p[at + 1]) : (p[at + 1] << 8 | p[at]);
    return true;
  }
  bool u32(std::size_t at, std::uint32_t& v) const {
    std::uint32_t hi, lo;
    if (!u16(at, big ? hi : lo) || !u16(at + 2, big ? lo : hi)) return false;
    v = hi << 16 | lo;
    return true;
  }
};

}  // namespace

int exif_orientation(const std::uint8_t* tiff, std::size_t size) {
  if (!tiff || size < 8) return 1;
  Tiff t{tiff, size, false};
  if (std::memcmp(tiff, "MM\0*", 4) == 0)
    t.big = true;
  else if (std::memcmp(tiff, "II*\0", 4) != 0)
    return 1;
  std::uint32_t ifd = 0, count = 0;
  if (!t.u32(4, ifd) || !t.u16(ifd, count)) return 1;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t e = std::size_t(ifd) + 2 + std::size_t(i) * 12;
    std::uint32_t tag = 0, type = 0, value = 0;
    if (!t.u16(e, tag) || !t.u16(e + 2, type)) return 1;
    if (tag != 0x0112) continue;
    if (type != 3 || !t.u16(e + 8, value)) return 1;  // SHORT, inline in the value field
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return 1;
}

void apply_orientation(Image& img, int o) {
  if (o <= 1 || o > 8) return;
  const int64_t W = img.width, H = img.height;
  const bool swap = o >= 5;  // 5..8 transpose the axes
  const int64_t ow = swap ? H : W, oh = swap ? W : H;
  std::vector<std::uint8_t> out(img.rgb.size());
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x = 0; x < ow; ++x) {
      int64_t sx = x, sy = y;  // PIL's exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose,
      switch (o) {             // 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise
        case 2: sx = W - 1 - x; break;
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;
        case 4: sy = H - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = H - 1 - x; break;
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;
        case 8: sx = W - 1 - y; sy = x; break;
      }
      std::memcpy(&out[(y * ow + x) * 3], &img.rgb[(sy * W + sx) * 3], 3);
    }
  img.rgb = std::move(out);
  img.width = ow;
  img.height = oh;
}

ImageFormat sniff_format(const std::uint8_t* d, std::size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::jpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::png;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return ImageFormat::webp;
  return ImageFormat::unknown;
}

Image decode_image(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits) {
  if (size == 0) throw UsageError(ax::str(name, ": the image file is empty"));
  switch (sniff_format(data, size)) {
    case ImageFormat::jpeg: return decode_jpeg(data, size, name, limits);
    case ImageFormat::png: return decode_png(data, size, name, limits);
    case ImageFormat::webp: return decode_webp(data, size, name, limits);
    default: break;
  }
  throw UsageError(ax::str(name, ": not a JPEG, PNG or WebP image (unrecognised first bytes)"));
}

namespace {
// The whole image file. core's InputFile (axengine/input_file.hpp) refuses anything but a regular file, a FIFO
// unopened (opening one waits for a writer: a row naming one would hang validate and run, skip or not), and
// names the path: "x.jpg: cannot open image file: No such file or directory".
std::vector<std::uint8_t> read_image_bytes(const std::string& path) {
  const InputFile f(path, "image file");
  const std::string bytes = f.read_all();
  return std::vector<std::uint8_t>(bytes.begin(), bytes.end());
}
}  // namespace

Image decode_image_file(const std::string& path, const DecodeLimits& limits) {
  const std::vector<std::uint8_t> bytes = read_image_bytes(path);
  return decode_image(bytes.data(), bytes.size(), path, limits);
}

ImageHeader read_image_header(const std::uint8_t* data, std::size_t size, const std::string& name, const DecodeLimits& limits) {
  if (size == 0) throw UsageError(ax::str(name, ": the image file is empty"));
  switch (sniff_format(data, size)) {
    case ImageFormat::jpeg: return read_jpeg(data, size, name, limits, nullptr);
    case ImageFormat::png: {  // as decode_png up to png_image_finish_read
      png_image png{};
      png.version = PNG_IMAGE_VERSION;
      if (!png_image_begin_read_from_memory(&png, data, size))
        throw UsageError(ax::str(name, ": not a decodable PNG (libpng: ", png.message, ")"));
      const ImageHeader h{png.width, png.height};
      png_image_free(&png);
      check_size(h.width, h.height, name, limits);
      return h;
    }
    case ImageFormat::webp: {  // as decode_webp up to WebPDecode*
      WebPBitstreamFeatures f;
      if (WebPGetFeatures(data, size, &f) != VP8_STATUS_OK) throw UsageError(ax::str(name, ": not a decodable WebP"));
      if (f.has_animation) throw UsageError(ax::str(name, ": animated WebP is not supported"));
      check_size(f.width, f.height, name, limits);
      return {f.width, f.height};
    }
    default: break;
  }
  throw UsageError(ax::str(name, ": not a JPEG, PNG or WebP image (unrecognised first bytes)"));
}

namespace {
std::atomic<std::uint64_t> g_header_bytes{0};
}

// The header sits in the first bytes of the file (JPEG: every marker before the first SOS; PNG: the chunks before
// IDAT; WebP: the RIFF/VP8X headers), so it is read from a prefix first. A prefix too short for it fails the read
// (libjpeg's source ends the cut data with an EOI, which is "no image" before SOS; libpng and libwebp report the
// short data), and only then is the whole file read and the header read again from it: a success from the prefix
// is the answer the whole file gives, and a failure's message is the whole file's. With data parallelism every rank
// reads every streamed image's header (mm_dataset.cpp), so this keeps that to 64 KiB a file.
ImageHeader read_image_header_file(const std::string& path, const DecodeLimits& limits) {
  constexpr std::uint64_t kPrefix = 64 * 1024;
  {
    const InputFile f(path, "image file");
    const std::uint64_t got = std::min(f.size(), kPrefix);
    const std::string head = f.read(0, got);
    g_header_bytes += got;
    const auto* data = reinterpret_cast<const std::uint8_t*>(head.data());
    // A file no longer than the prefix is all read already.
    if (f.size() <= kPrefix) return read_image_header(data, head.size(), path, limits);
    try {
      return read_image_header(data, head.size(), path, limits);
    } catch (const UsageError&) {  // the header runs past the prefix, or the file is bad: the whole file says which
    }
  }
  const std::vector<std::uint8_t> bytes = read_image_bytes(path);
  g_header_bytes += bytes.size();
  return read_image_header(bytes.data(), bytes.size(), path, limits);
}

std::uint64_t image_header_bytes_read() { return g_header_bytes.load(); }

}  // namespace ax::mm
