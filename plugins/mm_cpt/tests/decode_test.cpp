// Image decoding: bad inputs are errors naming the file, a decompression bomb is refused from its header, and
// the EXIF reader is bounds-checked.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "axengine/error.hpp"
#include "image.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using namespace ax::mm;

namespace {
const std::string kData = MM_CPT_TEST_DATA;
std::string read(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
std::string scratch(const std::string& name, const std::string& bytes) {
  fs::path d = fs::temp_directory_path() / ("mm_cpt_decode_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / name, std::ios::binary) << bytes;
  return (d / name).string();
}
const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
}  // namespace

TEST_CASE("mm_cpt decode: missing, empty, unknown and corrupt files are errors naming the file") {
  CHECK_THROWS_WITH_AS(decode_image_file("/nonexistent/x.jpg", {}), doctest::Contains("/nonexistent/x.jpg: cannot open"), ax::UsageError);
  const std::string empty = scratch("empty.png", "");
  CHECK_THROWS_WITH_AS(decode_image_file(empty, {}), doctest::Contains("empty.png: the image file is empty"), ax::UsageError);
  const std::string text = scratch("text.jpg", "hello, not an image");
  CHECK_THROWS_WITH_AS(decode_image_file(text, {}), doctest::Contains("text.jpg: not a JPEG, PNG or WebP"), ax::UsageError);
  // A directory (a row's image "" under image_base_dir; found by the mm_rows fuzzer): it opens, and its size reads
  // as 2^63 - 1, which was allocated.
  const std::string dir = fs::path(text).parent_path().string();
  const std::string not_regular = dir + ": not a regular file (a directory); expected an image file";
  CHECK_THROWS_WITH_AS(decode_image_file(dir, {}), doctest::Contains(not_regular.c_str()), ax::UsageError);
  CHECK_THROWS_WITH_AS(read_image_header_file(dir, {}), doctest::Contains(not_regular.c_str()), ax::UsageError);
  // A FIFO is refused without being opened: open(2) would wait for a writer that never comes.
  const std::string fifo = (fs::path(dir) / "pipe.jpg").string();
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string fifo_msg = fifo + ": not a regular file (a FIFO); expected an image file";
  CHECK_THROWS_WITH_AS(decode_image_file(fifo, {}), doctest::Contains(fifo_msg.c_str()), ax::UsageError);
  CHECK_THROWS_WITH_AS(read_image_header_file(fifo, {}), doctest::Contains(fifo_msg.c_str()), ax::UsageError);
  fs::remove(fifo);
  for (const char* name : {"a.jpg", "b.png", "c.webp"}) {
    CAPTURE(name);
    std::string bytes = read(kData + "/images/" + name);
    const std::string cut = scratch(std::string("cut_") + name, bytes.substr(0, bytes.size() / 3));
    // libjpeg recovers from a truncated stream (grey rest) as PIL does with LOAD_TRUNCATED_IMAGES; PNG and
    // WebP refuse. Either way: no crash, and an error names the file.
    try {
      Image img = decode_image_file(cut, {});
      CHECK(std::string(name) == "a.jpg");
      CHECK(img.rgb.size() == static_cast<std::size_t>(img.width * img.height * 3));
    } catch (const ax::UsageError& e) {
      CHECK(std::string(e.what()).find(cut) != std::string::npos);
    }
  }
}

TEST_CASE("mm_cpt decode: a decompression bomb is refused from its header, before any allocation") {
  // A PNG header declaring 60000 x 60000 (3.6 G pixels) followed by nothing: refused by size, not by data.
  std::string png = read(kData + "/images/b.png");
  auto put32 = [&](std::size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xff);
  };
  put32(16, 60000);
  put32(20, 60000);
  // The IHDR CRC is now wrong; libpng checks it only when reading the chunk, after our size check would
  // run on a valid one, so recompute it (zlib's crc32 polynomial) to make the header fully valid.
  uint32_t crc = 0xffffffffu;
  for (std::size_t i = 12; i < 29; ++i) {
    crc ^= static_cast<uint8_t>(png[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  put32(29, ~crc);
  const std::string bomb = scratch("bomb.png", png.substr(0, 64));
  CHECK_THROWS_WITH_AS(decode_image_file(bomb, DecodeLimits{}), doctest::Contains("bomb.png: the image header declares 60000x60000"),
                       ax::UsageError);
  // A limit below a real image's size refuses it the same way (JPEG and WebP headers too).
  DecodeLimits tight;
  tight.max_pixels = 1000;
  for (const char* name : {"a.jpg", "c.webp", "b.png"})
    CHECK_THROWS_WITH_AS(decode_image_file(kData + "/images/" + name, tight), doctest::Contains("over the limit of 1000 pixels"),
                         ax::UsageError);
}

TEST_CASE("mm_cpt decode: EXIF orientation is read bounds-checked and applied as PIL's exif_transpose") {
  // II, IFD at 8, one entry: tag 0x0112 SHORT count 1 value 6.
  const uint8_t le[] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0};
  CHECK(exif_orientation(le, sizeof le) == 6);
  const uint8_t be[] = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 3, 0, 0};
  CHECK(exif_orientation(be, sizeof be) == 3);
  for (std::size_t n = 0; n < sizeof le - 6; ++n) CHECK(exif_orientation(le, n) == 1);  // cut short: no read past the end
  uint8_t far[sizeof le];
  std::memcpy(far, le, sizeof le);
  far[4] = 0xff;  // IFD offset beyond the block
  CHECK(exif_orientation(far, sizeof far) == 1);
  Image img;
  img.width = 3;
  img.height = 2;
  for (int i = 0; i < 6; ++i) img.rgb.insert(img.rgb.end(), {uint8_t(i), uint8_t(i), uint8_t(i)});
  // 0 1 2 / 3 4 5 rotated 90 degrees clockwise: 3 0 / 4 1 / 5 2.
  apply_orientation(img, 6);
  CHECK(img.width == 2);
  CHECK(img.height == 3);
  std::vector<uint8_t> firsts;
  for (int i = 0; i < 6; ++i) firsts.push_back(img.rgb[i * 3]);
  CHECK(firsts == std::vector<uint8_t>{3, 0, 4, 1, 5, 2});
  Image rotated = decode_image_file(kData + "/images/i_exif6.jpg", {});
  CHECK(rotated.width == 52);  // stored 83 x 52
  CHECK(rotated.height == 83);
}

TEST_CASE("mm_cpt decode: the header alone gives the decoded size (EXIF orientation applied) and the same refusals") {
  for (const auto& e : fs::directory_iterator(kData + "/images")) {
    const std::string path = e.path().string();
    CAPTURE(path);
    const ImageHeader h = read_image_header_file(path, {});
    const Image img = decode_image_file(path, {});
    CHECK(h.width == img.width);
    CHECK(h.height == img.height);
  }
  // i_exif6.jpg is stored landscape and turned by its EXIF orientation 6: the header says the turned size.
  const ImageHeader turned = read_image_header_file(kData + "/images/i_exif6.jpg", {});
  CHECK(turned.height > turned.width);
  // The refusals decoding makes before it allocates, with its messages.
  CHECK_THROWS_WITH_AS(read_image_header_file("/nonexistent/x.jpg", {}), doctest::Contains("/nonexistent/x.jpg: cannot open"), ax::UsageError);
  const std::string empty = scratch("hdr_empty.png", "");
  CHECK_THROWS_WITH_AS(read_image_header_file(empty, {}), doctest::Contains("hdr_empty.png: the image file is empty"), ax::UsageError);
  const std::string text = scratch("hdr_text.jpg", "hello, not an image");
  CHECK_THROWS_WITH_AS(read_image_header_file(text, {}), doctest::Contains("hdr_text.jpg: not a JPEG, PNG or WebP"), ax::UsageError);
  DecodeLimits tight;
  tight.max_pixels = 1000;
  for (const char* name : {"a.jpg", "c.webp", "b.png"}) {
    CAPTURE(name);
    const std::string path = kData + "/images/" + name;
    CHECK_THROWS_WITH_AS(read_image_header_file(path, tight), doctest::Contains("over the limit of 1000 pixels"), ax::UsageError);
    // A file cut after its header: the header reads, the pixels may not (found only by the decode).
    const std::string bytes = read(path);
    const std::string cut = scratch(std::string("hdr_cut_") + name, bytes.substr(0, std::min<std::size_t>(bytes.size(), 2048)));
    try {
      const ImageHeader h = read_image_header_file(cut, {});
      CHECK(h.width == read_image_header_file(path, {}).width);
    } catch (const ax::UsageError& e) {
      CHECK(std::string(e.what()).find(cut) != std::string::npos);
    }
  }
}

TEST_CASE("mm_cpt decode: a header in a file's first 64 KiB is read from them alone, one past them from the whole file") {
  // Large files: the committed images with 200 KiB after their end (decoders stop at the image's end).
  const std::string tail(200 * 1024, '\0');
  for (const char* name : {"j_large.jpg", "b.png", "d.webp"}) {
    CAPTURE(name);
    const std::string path = scratch(std::string("big_") + name, read(kData + "/images/" + name) + tail);
    const std::uint64_t before = image_header_bytes_read();
    const ImageHeader h = read_image_header_file(path, {});
    CHECK(image_header_bytes_read() - before == 64 * 1024);
    const Image img = decode_image_file(path, {});
    CHECK(h.width == img.width);
    CHECK(h.height == img.height);
  }
  // A JPEG whose frame header (SOF) lies past the first 64 KiB, behind two 40,000-byte comment segments: the prefix
  // holds no image (libjpeg ends it at a fake EOI), so the whole file is read and gives the decoder's size.
  const std::string jpg = read(kData + "/images/i_exif6.jpg");
  std::string comment = "\xFF\xFE";
  comment += static_cast<char>(40000 >> 8);
  comment += static_cast<char>(40000 & 0xFF);
  comment += std::string(40000 - 2, 'c');
  const std::string late = scratch("late_sof.jpg", jpg.substr(0, 2) + comment + comment + jpg.substr(2));
  const std::uint64_t before = image_header_bytes_read();
  const ImageHeader h = read_image_header_file(late, {});
  CHECK(image_header_bytes_read() - before == 64 * 1024 + fs::file_size(late));
  const Image img = decode_image_file(late, {});
  CHECK(h.width == img.width);
  CHECK(h.height == img.height);
  CHECK(h.height > h.width);  // the EXIF orientation (APP1, after the comments) still turns it
  // Refusals come from the whole file, with the decoder's message: a bomb's header past the prefix too.
  DecodeLimits tight;
  tight.max_pixels = 1000;
  CHECK_THROWS_WITH_AS(read_image_header_file(late, tight), doctest::Contains("over the limit of 1000 pixels"), ax::UsageError);
}
