// Streamed mm_cpt data on several data-parallel ranks: every rank packs every row of a step (the image tokens
// counted from the images' headers), but only the rank that trains a row decodes its images
// (Sample::materialise, core's StreamFeed::set_materialise_eagerly(false) and read_streamed_step). The rows, their
// order, the samples and their pixels are those of one rank reading everything; the decode counter shows each
// of two ranks decoding about half the images. A row whose header reads but whose pixels do not is skipped on
// one rank (on_bad_row = "skip") and stops a multi-rank run, naming the row and the file.
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include <ATen/ATen.h>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/registry.hpp"
#include "data/data_config.hpp"
#include "data/prepare.hpp"
#include "mm_dataset.hpp"
#include "train/stream_step.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;

namespace {
const std::string kData = MM_CPT_TEST_DATA;

const ax::Tokenizer& tokenizer() {
  static auto tok = ax::load_hf_tokenizer(kData + "/tokenizer");
  return *tok;
}

// A streamed run dir: the committed images under img/, `rows` as data.jsonl, `extra` in the dataset entry.
fs::path run_dir(const std::string& name, const std::string& rows, const std::string& extra) {
  static std::mt19937_64 rng{std::random_device{}()};
  fs::path d = fs::temp_directory_path() / ("mm_cpt_rank_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(rng()));
  fs::create_directories(d / "img");
  for (const auto& e : fs::directory_iterator(kData + "/images")) fs::copy_file(e.path(), d / "img" / e.path().filename());
  std::ofstream(d / "data.jsonl") << rows;
  std::ofstream(d / "run.toml") << "[run]\noutput_dir = \"out\"\n[data]\nsequence_len = 256\n"
                                   "[[datasets]]\ntype = \"mm_cpt\"\npath = \"data.jsonl\"\nstreaming = true\n"
                                   "min_pixels = 3136\nmax_pixels = 12544\n" << extra << "[train]\nmax_steps = 4\n";
  return d;
}

std::shared_ptr<ax::data::StreamFeed> open_feed(const fs::path& dir) {
  static ax::Registry reg = [] {
    ax::Registry r;
    ax::mm::add_mm_cpt_type(r);
    return r;
  }();
  auto cfg = ax::load_config((dir / "run.toml").string(), {});
  auto feed = ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tokenizer()).stream;
  REQUIRE(feed);
  return feed;
}

// 30 rows of one or two of the committed images (several sizes, an EXIF-turned JPEG, PNG with alpha, WebP).
std::string rows_of_images() {
  const char* imgs[] = {"a.jpg", "b.png", "c.webp", "d.webp", "e_alpha.png", "f_grey.png", "g_palette.png",
                        "h_grey.jpg", "i_exif6.jpg", "k_tiny.png"};
  std::string out;
  for (int i = 0; i < 30; ++i) {
    const std::string a = imgs[i % 10], b = imgs[(i * 3 + 1) % 10];
    out += i % 3 == 0 ? "{\"text\": \"row " + std::to_string(i) + ": <image> and <image>\", \"images\": [\"img/" + a + "\", \"img/" + b + "\"]}\n"
                      : "{\"text\": \"row " + std::to_string(i) + " shows <image>\", \"images\": \"img/" + a + "\"}\n";
  }
  return out;
}

int64_t images_in(const ax::train::StreamedStep& st) {
  int64_t n = 0;
  for (const auto& mb : st.samples)
    for (const auto& s : mb) n += s.extras.at("image_grid_thw").size(0);
  return n;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}
}  // namespace

TEST_CASE("mm_cpt streaming, data parallel: each of two ranks decodes only its rows' images, the samples unchanged") {
  const fs::path dir = run_dir("half", rows_of_images(), "");
  auto one = open_feed(dir), r0 = open_feed(dir), r1 = open_feed(dir);
  r0->set_materialise_eagerly(false);
  r1->set_materialise_eagerly(false);
  int64_t decoded[2] = {0, 0}, trained_images = 0;
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    // One rank reading all 4 rows of the step (1 row x 4 micro-batches), and ranks 0 and 1 of two (1 x 2 each).
    auto all = ax::train::read_streamed_step(*one, 1, 4, 1, 0, 256);
    std::uint64_t before = ax::mm::image_decodes();
    auto a = ax::train::read_streamed_step(*r0, 1, 2, 2, 0, 256);
    const int64_t d0 = static_cast<int64_t>(ax::mm::image_decodes() - before);
    before = ax::mm::image_decodes();
    auto b = ax::train::read_streamed_step(*r1, 1, 2, 2, 1, 256);
    const int64_t d1 = static_cast<int64_t>(ax::mm::image_decodes() - before);
    // Exactly the images of its own rows: none of the other rank's, none of the packer's lookahead sample.
    CHECK(d0 == images_in(a));
    CHECK(d1 == images_in(b));
    CHECK(images_in(a) + images_in(b) == images_in(all));
    decoded[0] += d0, decoded[1] += d1, trained_images += images_in(all);
    CHECK(a.tokens == all.tokens);
    CHECK(b.trainable == all.trainable);
    CHECK(r0->cursor().to_json() == r1->cursor().to_json());
    CHECK(r0->cursor().to_json() == one->cursor().to_json());
    // Rank k's micro-batch j is row j * world + k of the step: the same samples, bitwise the same pixels.
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) {
        CAPTURE(j);
        CAPTURE(k);
        const auto& mine = (k == 0 ? a : b).samples[static_cast<std::size_t>(j)];
        const auto& want = all.samples[static_cast<std::size_t>(j * 2 + k)];
        REQUIRE(mine.size() == want.size());
        for (std::size_t i = 0; i < mine.size(); ++i) {
          CHECK_FALSE(mine[i].materialise);
          CHECK(mine[i].input_ids == want[i].input_ids);
          CHECK(mine[i].labels == want[i].labels);
          CHECK(at::equal(mine[i].extras.at("image_grid_thw"), want[i].extras.at("image_grid_thw")));
          CHECK(at::equal(mine[i].extras.at("pixel_values"), want[i].extras.at("pixel_values")));
        }
      }
  }
  MESSAGE("rank 0 decoded ", decoded[0], ", rank 1 ", decoded[1], " of the ", trained_images, " images trained on");
  CHECK(decoded[0] + decoded[1] == trained_images);
  CHECK(trained_images > 20);
  for (int64_t d : decoded) CHECK(d >= trained_images * 3 / 10);  // about half each
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt streaming: pixels that fail after a good header: skipped on one rank, an error naming the row on two") {
  // The first row's PNG is cut after its header: the header reads (its tokens are counted), the decode fails.
  // 120 rows after it: the first step's 4 packed rows stay in the first pass (the cut row is read once).
  std::string rows = "{\"text\": \"cut <image>\", \"images\": \"img/cut.png\"}\n";
  for (int i = 0; i < 4; ++i) rows += rows_of_images();
  for (const char* policy : {"error", "skip"}) {
    CAPTURE(policy);
    const fs::path dir = run_dir("cut", rows, std::string("on_bad_row = \"") + policy + "\"\n");
    {
      std::ifstream in(dir / "img/b.png", std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(dir / "img/cut.png", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
    }
    const std::string where = (dir / "data.jsonl").string() + ":1: " + (dir / "img/cut.png").string() + ": not a decodable PNG";
    // One rank: materialised as it is read, under on_bad_row as any bad row.
    auto one = open_feed(dir);
    if (std::string(policy) == "error") {
      CHECK(error_of([&] { ax::train::read_streamed_step(*one, 1, 4, 1, 0, 256); }).find(where) != std::string::npos);
    } else {
      ax::train::read_streamed_step(*one, 1, 4, 1, 0, 256);
      CHECK(one->skipped_late() == 1);
    }
    CHECK(one->cursor().pass == 0);
    // Two ranks: the row is packed on both; rank 1 does not train it (nor decode it), rank 0 stops on it.
    auto r0 = open_feed(dir), r1 = open_feed(dir);
    r0->set_materialise_eagerly(false);
    r1->set_materialise_eagerly(false);
    CHECK(error_of([&] { ax::train::read_streamed_step(*r1, 1, 2, 2, 1, 256); }) == "(no UsageError)");
    const std::string err = error_of([&] { ax::train::read_streamed_step(*r0, 1, 2, 2, 0, 256); });
    CHECK(err.find(where) != std::string::npos);
    if (std::string(policy) == "skip") CHECK(err.find("on_bad_row = \"skip\" cannot drop it here") != std::string::npos);
    fs::remove_all(dir);
  }
}
