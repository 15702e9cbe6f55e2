// The mm_cpt dataset type: raw rows (placeholders -> vision tokens), tokenized rows, bad rows and images under
// on_bad_row, config validation, the prepared-data cache (decode counts) and collation.
#include <filesystem>
#include <fstream>

#include <unistd.h>
#include <random>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/registry.hpp"
#include "data/data_config.hpp"
#include "data/prepare.hpp"
#include "e2e_util.hpp"
#include "image.hpp"
#include "mm_dataset.hpp"
#include "processor.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using namespace ax::mm;

namespace {
const std::string kData = MM_CPT_TEST_DATA;

const ax::Tokenizer& tokenizer() {
  static auto tok = ax::load_hf_tokenizer(kData + "/tokenizer");
  return *tok;
}
int32_t id_of(const std::string& t) { return tokenizer().encode(t, false).at(0); }

// A fresh directory with the committed images under img/ and `jsonl` as data.jsonl.
fs::path corpus(const std::string& name, const std::string& jsonl) { return mm_e2e::corpus("mm_cpt", name, jsonl); }

toml::table entry(const std::string& extra) {
  return toml::parse("type = \"mm_cpt\"\npath = \"data.jsonl\"\nmin_pixels = 3136\nmax_pixels = 12544\n" + extra);
}

std::shared_ptr<ax::Dataset> open(const fs::path& dir, const toml::table& e, const std::string& model_dir = "") {
  static MmCptType type;
  return type.open(e, ax::DatasetContext{&tokenizer(), (dir / "run.toml").string(), dir.string(), model_dir});
}

using mm_e2e::error_of;

int64_t count(const std::vector<int32_t>& v, int32_t id) { return std::count(v.begin(), v.end(), id); }
}  // namespace

TEST_CASE("mm_cpt dataset: raw rows expand each placeholder to vision_start + image_pad x t*h*w/4 + vision_end") {
  auto dir = corpus("raw", R"({"text": "A photo <image> of a field.", "images": "img/a.jpg"}
{"text": "Two: <image> and <image>.", "images": ["img/b.png", "img/i_exif6.jpg"]}
{"text": "No image at all."}
)");
  auto ds = open(dir, entry(""));
  REQUIRE(ds->size() == 3);
  const int32_t pad = id_of("<|image_pad|>"), vs = id_of("<|vision_start|>"), ve = id_of("<|vision_end|>");
  ProcessorConfig pc;
  pc.min_pixels = 3136;
  pc.max_pixels = 12544;

  ax::Sample two = ds->get(1);
  const at::Tensor grid = two.extras.at("image_grid_thw");
  REQUIRE((grid.sizes() == at::IntArrayRef{2, 3}));
  const int64_t n0 = grid[0].prod().item<int64_t>() / 4, n1 = grid[1].prod().item<int64_t>() / 4;
  CHECK(count(two.input_ids, pad) == n0 + n1);
  CHECK(count(two.input_ids, vs) == 2);
  CHECK(count(two.input_ids, ve) == 2);
  // Layout: ... vs pad*n0 ve ... vs pad*n1 ve ..., and the image tokens carry no loss.
  auto first = std::find(two.input_ids.begin(), two.input_ids.end(), vs) - two.input_ids.begin();
  CHECK(two.input_ids[first + n0 + 1] == ve);
  for (std::size_t i = 0; i < two.input_ids.size(); ++i)
    if (two.input_ids[i] == pad || two.input_ids[i] == vs || two.input_ids[i] == ve) CHECK(two.labels[i] == -100);
  CHECK(two.labels.back() == tokenizer().eos_id());
  // The pixels are the processor's over the decoded images, in the row's order.
  auto a = process_image(decode_image_file(kData + "/images/b.png", {}), pc);
  auto b = process_image(decode_image_file(kData + "/images/i_exif6.jpg", {}), pc);
  CHECK(at::equal(two.extras.at("pixel_values"), at::cat({a.pixel_values, b.pixel_values}, 0)));

  ax::Sample none = ds->get(2);
  CHECK((none.extras.at("pixel_values").sizes() == at::IntArrayRef{0, 1176}));
  CHECK((none.extras.at("image_grid_thw").sizes() == at::IntArrayRef{0, 3}));
  CHECK(count(none.input_ids, pad) == 0);
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt dataset: placeholder/image count mismatches and bad images name the row and file, or are skipped") {
  auto dir = corpus("bad", R"({"text": "ok <image>", "images": "img/a.jpg"}
{"text": "two markers <image> <image>", "images": "img/a.jpg"}
{"text": "missing <image>", "images": "img/nope.jpg"}
{"text": "empty <image>", "images": "img/empty.png"}
{"text": "corrupt <image>", "images": "img/corrupt.webp"}
{"text": "injected <|image_pad|> <image>", "images": "img/a.jpg"}
)");
  std::ofstream(dir / "img/empty.png").close();
  std::ofstream(dir / "img/corrupt.webp") << std::string("RIFF\x10\0\0\0WEBPVP8 garbage", 23);
  std::string err = error_of([&] { open(dir, entry("")); });
  CHECK(err.find("data.jsonl:2: the text has 2 '<image>' placeholder(s) for 1 image(s)") != std::string::npos);

  auto ds = open(dir, entry("on_bad_row = \"skip\"\n"));
  CHECK(ds->size() == 1);
  CHECK(ds->skipped_rows() == 5);

  auto only = [&](int line) {
    std::ifstream in(dir / "data.jsonl");
    std::string l;
    for (int i = 0; i < line; ++i) std::getline(in, l);
    std::ofstream(dir / "one.jsonl") << l << "\n";
    return error_of([&] { open(dir, toml::parse("type = \"mm_cpt\"\npath = \"one.jsonl\"\nmin_pixels = 3136\nmax_pixels = 12544\n")); });
  };
  CHECK(only(3).find("one.jsonl:1: " + (dir / "img/nope.jpg").string() + ": cannot open image file: No such file or directory") != std::string::npos);
  CHECK(only(4).find("img/empty.png: the image file is empty") != std::string::npos);
  CHECK(only(5).find("img/corrupt.webp: not a decodable WebP") != std::string::npos);
  CHECK(only(6).find("one.jsonl:1: the sample has") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt dataset: tokenized rows pass through, padding dropped, image tokens checked against the images") {
  auto dir = corpus("tok", R"({"text": "A photo <image> of a field.", "images": "img/a.jpg"})" "\n");
  ax::Sample raw = open(dir, entry(""))->get(0);
  nlohmann::json row;
  row["_mm_text"] = "A photo <image> of a field.";
  row["images"] = {"img/a.jpg"};
  std::vector<int32_t> ids = raw.input_ids, mask(ids.size(), 1), labels = raw.labels;
  ids.push_back(0);  // one padding position, dropped by its mask
  mask.push_back(0);
  labels.push_back(-100);
  row["input_ids"] = ids;
  row["attention_mask"] = mask;
  row["labels"] = labels;
  std::ofstream(dir / "tok.jsonl") << row.dump() << "\n";
  auto e = toml::parse("type = \"mm_cpt\"\nrows = \"tokenized\"\npath = \"tok.jsonl\"\nmin_pixels = 3136\nmax_pixels = 12544\n");
  ax::Sample s = open(dir, e)->get(0);
  CHECK(s.input_ids == raw.input_ids);
  CHECK(s.labels == raw.labels);
  CHECK(at::equal(s.extras.at("pixel_values"), raw.extras.at("pixel_values")));
  // A different max_pixels changes the image's token count: the ids no longer fit the image.
  auto e2 = toml::parse("type = \"mm_cpt\"\nrows = \"tokenized\"\npath = \"tok.jsonl\"\nmin_pixels = 3136\nmax_pixels = 3136\n");
  CHECK(error_of([&] { open(dir, e2); }).find("tok.jsonl:1: the sample has") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt dataset: unknown and ambiguous keys are config errors with their location") {
  auto dir = corpus("keys", "{\"text\": \"x\"}\n");
  std::string err = error_of([&] { open(dir, entry("max_pixel = 5\n")); });
  CHECK(err.find("max_pixel") != std::string::npos);
  CHECK(err.find("max_pixels") != std::string::npos);  // did you mean
  err = error_of([&] { open(dir, toml::parse("type = \"mm_cpt\"\nrows = \"tokenized\"\npath = \"data.jsonl\"\ntext_column = \"t\"\n")); });
  CHECK(err.find("run.toml:4:") != std::string::npos);
  CHECK(err.find("applies to rows = \"raw\"") != std::string::npos);
  err = error_of([&] { open(dir, toml::parse("type = \"mm_cpt\"\npath = \"data.jsonl\"\nmin_pixels = 20000\nmax_pixels = 12544\n")); });
  CHECK(err.find("run.toml:4:") != std::string::npos);
  CHECK(err.find("min_pixels <= max_pixels") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt dataset: the processor's settings come from the model's preprocessor_config.json, the entry overrides") {
  auto dir = corpus("model", R"({"text": "<image>", "images": "img/j_large.jpg"})" "\n");
  fs::create_directories(dir / "model");
  std::ofstream(dir / "model/preprocessor_config.json") << R"({"min_pixels": 3136, "max_pixels": 6272, "patch_size": 14, "merge_size": 2})";
  auto e = toml::parse("type = \"mm_cpt\"\npath = \"data.jsonl\"\n");
  at::Tensor g = open(dir, e, (dir / "model").string())->get(0).extras.at("image_grid_thw");
  CHECK(g[0][1].item<int64_t>() * g[0][2].item<int64_t>() * 196 <= 6272);
  at::Tensor g2 = open(dir, entry(""), (dir / "model").string())->get(0).extras.at("image_grid_thw");
  CHECK(g2[0][1].item<int64_t>() * g2[0][2].item<int64_t>() > g[0][1].item<int64_t>() * g[0][2].item<int64_t>());
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt dataset: a cached prepare decodes no image again; changing max_pixels re-prepares") {
  auto dir = corpus("cache", R"({"text": "one <image>", "images": "img/a.jpg"}
{"text": "two <image> <image>", "images": ["img/c.webp", "img/d.webp"]}
{"text": "three <image>", "images": "img/j_large.jpg"}
{"text": "four, text only"}
)");
  ax::Registry reg;
  add_mm_cpt_type(reg);
  auto write_run = [&](int64_t max_pixels) {
    std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\n[data]\nsequence_len = 256\neval_fraction = 0.0\ncache = true\n"
                                       "cache_dir = \"" << (dir / "cache").string() << "\"\n[[datasets]]\ntype = \"mm_cpt\"\n"
                                       "path = \"data.jsonl\"\nmin_pixels = 3136\nmax_pixels = " << max_pixels << "\n";
  };
  auto prepare = [&] {
    auto cfg = ax::load_config((dir / "run.toml").string(), {});
    return ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tokenizer());
  };
  write_run(12544);
  std::uint64_t before = image_decodes();
  auto fresh = prepare();
  CHECK(image_decodes() - before == 4);
  CHECK_FALSE(fresh.sources.at(0).from_cache);
  before = image_decodes();
  auto cached = prepare();
  CHECK(cached.sources.at(0).from_cache);
  CHECK(image_decodes() - before == 0);  // nothing decoded: every sample and its pixels come from the cache
  REQUIRE(cached.train.size() == fresh.train.size());
  for (std::size_t i = 0; i < fresh.train.size(); ++i) {
    CHECK(cached.train[i].input_ids == fresh.train[i].input_ids);
    CHECK(at::equal(cached.train[i].extras.at("pixel_values"), fresh.train[i].extras.at("pixel_values")));
    CHECK(at::equal(cached.train[i].extras.at("image_grid_thw"), fresh.train[i].extras.at("image_grid_thw")));
  }
  write_run(6272);
  before = image_decodes();
  auto changed = prepare();
  CHECK_FALSE(changed.sources.at(0).from_cache);
  CHECK(image_decodes() - before == 4);

  // The processor settings of the model dir key the cache too (core's prepare step hashes the model's
  // preprocessor_config.json): editing it re-prepares, an unchanged one is a cache hit.
  fs::create_directories(dir / "model");
  std::ofstream(dir / "model/preprocessor_config.json") << R"({"min_pixels": 3136, "max_pixels": 12544})";
  auto with_model = [&](const std::string& text) {
    std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\n[model]\npath = \"model\"\n[data]\nsequence_len = 256\n"
                                       "eval_fraction = 0.0\ncache = true\ncache_dir = \"" << (dir / "cache").string()
                                    << "\"\n[[datasets]]\ntype = \"mm_cpt\"\npath = \"data.jsonl\"\n";
    if (!text.empty()) std::ofstream(dir / "model/preprocessor_config.json") << text;
    return prepare();
  };
  CHECK_FALSE(with_model("").sources.at(0).from_cache);
  CHECK(with_model("").sources.at(0).from_cache);
  before = image_decodes();
  auto edited = with_model(R"({"min_pixels": 3136, "max_pixels": 6272})");
  CHECK_FALSE(edited.sources.at(0).from_cache);
  CHECK(image_decodes() - before == 4);
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt dataset: collate concatenates pixel_values and grids in the batch's sample order") {
  auto dir = corpus("collate", R"({"text": "a <image>", "images": "img/a.jpg"}
{"text": "b <image> <image>", "images": ["img/b.png", "img/k_tiny.png"]}
{"text": "c"}
)");
  auto ds = open(dir, entry(""));
  std::vector<ax::Sample> s{ds->get(0), ds->get(1), ds->get(2)};
  MmCptType type;
  // The type under test learns the image token when it opens an entry.
  type.open(entry(""), ax::DatasetContext{&tokenizer(), (dir / "run.toml").string(), dir.string(), ""});
  ax::BatchLayout layout;
  layout.rows = 2;
  layout.sequence_len = 512;
  // Row 0 holds sample 1 then sample 2; row 1 holds sample 0: the order is row, then offset.
  const auto n = [&](int i) { return static_cast<int64_t>(s[i].input_ids.size()); };
  layout.samples = {{&s[1], 0, 0, n(1)}, {&s[2], 0, n(1), n(2)}, {&s[0], 1, 0, n(0)}};
  auto out = type.collate(layout);
  CHECK(at::equal(out.at("pixel_values"), at::cat({s[1].extras.at("pixel_values"), s[0].extras.at("pixel_values")}, 0)));
  CHECK(at::equal(out.at("image_grid_thw"), at::cat({s[1].extras.at("image_grid_thw"), s[0].extras.at("image_grid_thw")}, 0)));
  // A sample cut inside its image tokens is refused: the model would see fewer image tokens than patches.
  layout.samples = {{&s[0], 0, 0, 3}};
  CHECK(error_of([&] { type.collate(layout); }).find("inside its image tokens") != std::string::npos);
  fs::remove_all(dir);
}
