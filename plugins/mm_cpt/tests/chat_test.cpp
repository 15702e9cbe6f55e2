// Images in core's chat_template rows, processed by this plugin for Qwen2.5-VL (docs/datasets.md, "Images in
// conversations"): parity with transformers' processor + chat template on the committed conversations, the bad
// inputs (each under on_bad_row = error and skip), the prepared-data cache keyed by the processor's settings,
// and collation of packed multimodal rows.
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/model.hpp"
#include "axengine/models.hpp"
#include "axengine/registry.hpp"
#include "axengine/selection.hpp"
#include "axengine/stream.hpp"
#include "axengine/strings.hpp"
#include "data/data_config.hpp"
#include "data/packing.hpp"
#include "data/prepare.hpp"
#include "data/register.hpp"
#include "chat_util.hpp"
#include "e2e_util.hpp"
#include "mm_dataset.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kData = MM_CPT_TEST_DATA;
const std::string kChat = kData + "/chat";
const std::string kModel = kChat + "/model";

const ax::Tokenizer& tokenizer() {
  static auto tok = ax::load_hf_tokenizer(kModel);
  return *tok;
}

std::shared_ptr<ax::Dataset> open(const std::string& toml, const std::string& base, const std::string& model = kModel) {
  return mm_chat::open(toml, base, tokenizer(), model);
}

using mm_chat::kShareGpt;
using mm_chat::registry;
using mm_e2e::error_of;
fs::path corpus(const std::string& name, const std::string& jsonl) { return mm_e2e::corpus("mm_chat", name, jsonl); }

int64_t count(const std::vector<int32_t>& v, int32_t id) { return std::count(v.begin(), v.end(), id); }
int32_t id_of(const std::string& t) { return tokenizer().encode(t, false).at(0); }

}  // namespace

// The committed conversations (chat/openai.jsonl, chat/sharegpt.jsonl) through `model`'s chat template and
// processor against transformers' (goldens.jsonl of `goldens_dir`), with each image's grid and patches.
void check_chat_goldens(const std::string& goldens_dir, const std::string& model, int64_t patch_dim) {
  mm_chat::check_goldens(kChat, goldens_dir, model, [&](const ax::Sample& s, const json& golden) -> int64_t {
    const auto grid = golden["grid"].get<std::vector<std::vector<int64_t>>>();
    if (grid.empty()) return 0;
    const at::Tensor g = s.extras.at("image_grid_thw");
    REQUIRE(g.size(0) == static_cast<int64_t>(grid.size()));
    int64_t patches = 0;
    for (std::size_t j = 0; j < grid.size(); ++j) {
      for (int d = 0; d < 3; ++d) CHECK(g[j][d].item<int64_t>() == grid[j][d]);
      patches += grid[j][0] * grid[j][1] * grid[j][2];
    }
    CHECK((s.extras.at("pixel_values").sizes() == at::IntArrayRef{patches, patch_dim}));
    return static_cast<int64_t>(grid.size());
  });
}

TEST_CASE("chat_template with images: ids, labels and grids equal transformers' Qwen2.5-VL processor + chat template") {
  check_chat_goldens(kChat, kModel, 3 * 2 * 14 * 14);
}

TEST_CASE("chat_template with images: ids, labels and grids equal transformers' Qwen3-VL processor + chat template") {
  check_chat_goldens(kData + "/chat_qwen3_vl", kData + "/chat_qwen3_vl/model", 3 * 2 * 16 * 16);
}

// Qwen3-VL-MoE's processor is Qwen3-VL's (transformers' AutoProcessor maps qwen3_vl_moe to Qwen3VLProcessor) and
// its chat template Qwen3-VL's: the same goldens, through a model dir whose config.json says qwen3_vl_moe.
TEST_CASE("chat_template with images: ids, labels and grids of a qwen3_vl_moe model equal transformers' Qwen3-VL processor's") {
  const fs::path model = mm_e2e::scratch("mm_chat", "qwen3_vl_moe_model");
  for (const auto& e : fs::directory_iterator(kData + "/chat_qwen3_vl/model")) fs::copy_file(e.path(), model / e.path().filename());
  json cfg = json::parse(std::ifstream(model / "config.json"));
  cfg["model_type"] = "qwen3_vl_moe";
  cfg["architectures"] = {"Qwen3VLMoeForConditionalGeneration"};
  std::ofstream(model / "config.json") << cfg.dump(2);
  check_chat_goldens(kData + "/chat_qwen3_vl", model.string(), 3 * 2 * 16 * 16);
  fs::remove_all(model);
}

TEST_CASE("chat_template with images: a missing or corrupt image, an http URL, placeholders that miss: named, on_bad_row decides") {
  auto dir = corpus("bad", R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "ok?"}]}, {"role": "assistant", "content": "fine"}]}
{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image", "image": "img/none.png"}]}, {"role": "assistant", "content": "no"}]}
{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "img/corrupt.png"}}]}, {"role": "assistant", "content": "no"}]}
)");
  std::ofstream(dir / "img/corrupt.png") << "\x89PNG\r\n\x1a\n this is not a png";
  const std::string base = "type = \"chat_template\"\npath = \"data.jsonl\"\n";
  std::string e = error_of([&] { open(base, dir.string()); });
  CHECK(e.find("data.jsonl:2") != std::string::npos);
  CHECK(e.find("message 2, image 0") != std::string::npos);
  CHECK(e.find("none.png") != std::string::npos);

  auto skipped = open(base + "on_bad_row = \"skip\"\n", dir.string());
  CHECK(skipped->size() == 1);  // row 1; 2 (missing) and 3 (corrupt) dropped
  CHECK(skipped->skipped_rows() == 2);
  CHECK(skipped->get(0).extras.count("pixel_values") == 1);

  std::ofstream(dir / "one.jsonl") << R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "img/corrupt.png"}}]}, {"role": "assistant", "content": "no"}]})" "\n";
  e = error_of([&] { open("type = \"chat_template\"\npath = \"one.jsonl\"\n", dir.string()); });
  CHECK(e.find("one.jsonl:1") != std::string::npos);
  CHECK(e.find("message 0, image 0") != std::string::npos);
  CHECK(e.find("corrupt.png") != std::string::npos);

  std::ofstream(dir / "url.jsonl") << R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "https://example.com/a.png"}]}, {"role": "assistant", "content": "no"}]})" "\n";
  e = error_of([&] { open("type = \"chat_template\"\npath = \"url.jsonl\"\n", dir.string()); });
  CHECK(e.find("url.jsonl:1") != std::string::npos);
  CHECK(e.find("message 0, part 0") != std::string::npos);
  CHECK(e.find("local files only") != std::string::npos);

  std::ofstream(dir / "video.jsonl") << R"({"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}, {"role": "assistant", "content": "no"}]})" "\n";
  CHECK(error_of([&] { open("type = \"chat_template\"\npath = \"video.jsonl\"\n", dir.string()); }).find("content type 'video' is not supported") != std::string::npos);

  // ShareGPT: more placeholders than images (row 5), fewer (row 6).
  const std::string share = base + kShareGpt;
  std::ofstream(dir / "more.jsonl") << R"({"conversations": [{"from": "human", "value": "<image> and <image>"}, {"from": "gpt", "value": "no"}], "images": ["img/b.png"]})" "\n";
  e = error_of([&] { open(std::string("type = \"chat_template\"\npath = \"more.jsonl\"\n") + kShareGpt, dir.string()); });
  CHECK(e.find("more.jsonl:1") != std::string::npos);
  CHECK(e.find("2 '<image>' placeholder(s) for 1 image(s)") != std::string::npos);
  std::ofstream(dir / "fewer.jsonl") << R"({"conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "no"}], "images": ["img/b.png", "img/c.webp"]})" "\n";
  e = error_of([&] { open(std::string("type = \"chat_template\"\npath = \"fewer.jsonl\"\n") + kShareGpt, dir.string()); });
  CHECK(e.find("1 '<image>' placeholder(s) for 2 image(s)") != std::string::npos);
  std::ofstream(dir / "data.jsonl", std::ios::app)
      << R"({"conversations": [{"from": "human", "value": "<image> and <image>"}, {"from": "gpt", "value": "no"}], "images": ["img/b.png"]})" "\n"
      << R"({"conversations": [{"from": "human", "value": "look: <image>"}, {"from": "gpt", "value": "yes"}], "images": ["img/b.png"]})" "\n";
  auto share_skip = open(share + "on_bad_row = \"skip\"\n", dir.string());
  CHECK(share_skip->size() == 1);  // the last row; 4 miscounts, 1-3 lack 'conversations'
  CHECK(share_skip->skipped_rows() == 4);
  CHECK(share_skip->get(0).extras.at("image_grid_thw").size(0) == 1);
  fs::remove_all(dir);
}

TEST_CASE("chat_template with images: an image part in a text-only family's dataset is a bad row naming the family") {
  auto dir = corpus("textonly", R"({"messages": [{"role": "user", "content": "plain"}, {"role": "assistant", "content": "text"}]}
{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}]}, {"role": "assistant", "content": "x"}]}
)");
  fs::create_directories(dir / "model");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) fs::copy_file(kModel + "/" + f, dir / "model" / f);
  std::ofstream(dir / "model/config.json") << R"({"model_type": "qwen2"})";
  const std::string base = "type = \"chat_template\"\npath = \"data.jsonl\"\n";
  const std::string e = error_of([&] { open(base, dir.string(), (dir / "model").string()); });
  CHECK(e.find("data.jsonl:2: message 0") != std::string::npos);
  CHECK(e.find("model_type 'qwen2') takes no images") != std::string::npos);
  CHECK(e.find("its family reads no image processor (the vision-language families do") != std::string::npos);
  auto ds = open(base + "on_bad_row = \"skip\"\n", dir.string(), (dir / "model").string());
  CHECK(ds->size() == 1);
  CHECK(ds->skipped_rows() == 1);
  CHECK(ds->get(0).extras.empty());
  fs::remove_all(dir);
}

namespace {

// prepare_datasets over dir/data.jsonl with the committed model, `sequence_len` and the entry's `extra` keys.
ax::data::PreparedData prepare(const fs::path& dir, int64_t sequence_len, const std::string& extra, const std::string& model = kModel) {
  std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\n[model]\npath = \"" << model << "\"\n[data]\nsequence_len = "
                                  << sequence_len << "\neval_fraction = 0.0\ncache = true\ncache_dir = \"" << (dir / "cache").string()
                                  << "\"\n[[datasets]]\ntype = \"chat_template\"\npath = \"data.jsonl\"\n" << extra;
  auto cfg = ax::load_config((dir / "run.toml").string(), {});
  return ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), registry(), tokenizer(), 0, ax::model_image_processor(cfg.model.path));
}

std::size_t cache_files(const fs::path& dir) {
  std::size_t n = 0;
  if (fs::exists(dir / "cache"))
    for (const auto& e : fs::directory_iterator(dir / "cache")) n += e.path().extension() == ".safetensors";
  return n;
}

}  // namespace

TEST_CASE("chat_template with images: a row whose image tokens pass sequence_len is named; skip drops it; no partial cache") {
  auto dir = corpus("seqlen", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
{"messages": [{"role": "user", "content": [{"type": "text", "text": "look at this picture, the one with the long caption before it"}, {"type": "image", "image": "img/j_large.jpg"}]}, {"role": "assistant", "content": "big"}]}
)");
  auto fits = prepare(dir, 512, "");
  REQUIRE(fits.train.size() == 2);
  const int64_t end = fits.train[1].extras.at("image_tokens_end").item<int64_t>();
  REQUIRE(static_cast<int64_t>(fits.train[0].input_ids.size()) < end - 1);
  const int64_t S = end - 1;  // the last image token falls out of the row
  const std::string e = error_of([&] { prepare(dir, S, ""); });
  CHECK(e.find("data.jsonl:2") != std::string::npos);
  CHECK(e.find(ax::str("past data.sequence_len = ", S)) != std::string::npos);
  CHECK(cache_files(dir) == 1);  // the file's samples are cached whole (sequence_len is not in the key) ...
  auto skipped = prepare(dir, S, "on_bad_row = \"skip\"\n");
  CHECK(skipped.train.size() == 1);  // ... and the row is dropped after the cache, counted
  CHECK(skipped.sources.at(0).unfit == 1);
  CHECK(ax::data::describe(skipped).find("1 rows whose images do not fit sequence_len dropped") != std::string::npos);
  // Streamed, the row is a bad row as it is read.
  const std::string stream = "streaming = true\n", steps = "[train]\nmax_steps = 2\n";
  const std::string se = error_of([&] { prepare(dir, S, stream + steps).stream->next_row(); });
  CHECK(se.find("data.jsonl:2") != std::string::npos);
  CHECK(se.find(ax::str("past data.sequence_len = ", S)) != std::string::npos);
  auto streamed = prepare(dir, S, stream + "on_bad_row = \"skip\"\n" + steps);
  CHECK(streamed.stream->next_row().size() == 1);  // the first row alone: the pass ends after the dropped one
  CHECK(streamed.stream->skipped_late() == 1);

  // A missing image stops before anything is written to the cache; under skip the file's good rows are cached.
  auto bad = corpus("nocache", R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "img/gone.jpg"}]}, {"role": "assistant", "content": "x"}]}
{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}]}, {"role": "assistant", "content": "y"}]}
)");
  CHECK(error_of([&] { prepare(bad, 256, ""); }).find("gone.jpg") != std::string::npos);
  CHECK(cache_files(bad) == 0);
  auto kept = prepare(bad, 256, "on_bad_row = \"skip\"\n");
  CHECK(kept.train.size() == 1);
  CHECK(kept.sources.at(0).skipped == 1);
  CHECK(cache_files(bad) == 1);
  fs::remove_all(dir);
  fs::remove_all(bad);
}

TEST_CASE("chat_template with images: the cache serves the pixels without decoding; max_pixels or the model's processor re-prepares") {
  auto dir = corpus("cache", R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "what?"}]}, {"role": "assistant", "content": "a"}]}
{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/c.webp"}, {"type": "image", "image": "img/j_large.jpg"}]}, {"role": "assistant", "content": "b"}]}
{"messages": [{"role": "user", "content": "text"}, {"role": "assistant", "content": "c"}]}
)");
  std::uint64_t before = ax::mm::image_decodes();
  auto fresh = prepare(dir, 512, "");
  CHECK(ax::mm::image_decodes() - before == 3);
  before = ax::mm::image_decodes();
  auto cached = prepare(dir, 512, "");
  CHECK(cached.sources.at(0).from_cache);
  CHECK(ax::mm::image_decodes() - before == 0);
  REQUIRE(cached.train.size() == fresh.train.size());
  for (std::size_t i = 0; i < fresh.train.size(); ++i) {
    CHECK(cached.train[i].input_ids == fresh.train[i].input_ids);
    CHECK(cached.train[i].labels == fresh.train[i].labels);
    CHECK(cached.train[i].extras.size() == fresh.train[i].extras.size());
    for (const auto& [name, t] : fresh.train[i].extras) CHECK(at::equal(cached.train[i].extras.at(name), t));
  }
  auto smaller = prepare(dir, 512, "max_pixels = 3136\n");  // the entry's key
  CHECK_FALSE(smaller.sources.at(0).from_cache);
  const int32_t pad = id_of("<|image_pad|>");
  int64_t pads_fresh = 0, pads_small = 0;
  for (const auto& s : fresh.train) pads_fresh += count(s.input_ids, pad);
  for (const auto& s : smaller.train) pads_small += count(s.input_ids, pad);
  CHECK(pads_small < pads_fresh);

  // The model dir's preprocessor_config.json keys the cache too.
  fs::create_directories(dir / "model");
  for (const auto& e : fs::directory_iterator(kModel)) fs::copy_file(e.path(), dir / "model" / e.path().filename());
  CHECK_FALSE(prepare(dir, 512, "", (dir / "model").string()).sources.at(0).from_cache);
  CHECK(prepare(dir, 512, "", (dir / "model").string()).sources.at(0).from_cache);
  std::ofstream(dir / "model/preprocessor_config.json") << R"({"min_pixels": 3136, "max_pixels": 6272})";
  CHECK_FALSE(prepare(dir, 512, "", (dir / "model").string()).sources.at(0).from_cache);
  fs::remove_all(dir);
}

TEST_CASE("chat_template with images: packed rows carry their samples' pixels and grids in token order") {
  auto dir = corpus("pack", R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "one"}]}, {"role": "assistant", "content": "a"}]}
{"messages": [{"role": "user", "content": "text only"}, {"role": "assistant", "content": "b"}]}
{"messages": [{"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "image", "image": "img/b.png"}, {"type": "image", "image": "img/k_tiny.png"}]}, {"role": "assistant", "content": "c"}]}
)");
  auto data = prepare(dir, 512, "");
  REQUIRE(data.train.size() == 3);
  REQUIRE(data.collator);
  // All three in one row, in file order: the batch's pixel_values are theirs concatenated, the grids likewise.
  const std::vector<const ax::Sample*> samples{&data.train[0], &data.train[1], &data.train[2]};
  ax::BatchLayout layout;
  layout.rows = 1;
  layout.sequence_len = 512;
  int64_t at = 0;
  for (const auto* s : samples) {
    layout.samples.push_back({s, 0, at, static_cast<int64_t>(s->input_ids.size())});
    at += static_cast<int64_t>(s->input_ids.size());
  }
  auto extras = data.collator->collate(layout);
  CHECK(extras.count("image_tokens_end") == 0);  // the fit check's marker stays with the samples
  CHECK(at::equal(extras.at("pixel_values"), at::cat({data.train[0].extras.at("pixel_values"), data.train[2].extras.at("pixel_values")})));
  CHECK(at::equal(extras.at("image_grid_thw"), at::cat({data.train[0].extras.at("image_grid_thw"), data.train[2].extras.at("image_grid_thw")})));
  // A sample cut inside its image tokens is refused, not mis-trained.
  layout.samples = {{&data.train[2], 0, 0, 3}};
  CHECK(error_of([&] { data.collator->collate(layout); }).find("inside its image tokens") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("chat_template with images: tiny-qwen2_5-vl gives a packed row of conversations the logits each has alone") {
  // Packing keeps each sample's multimodal RoPE (restarting at its first token) and its images (in token order):
  // the logits of three conversations packed in one row equal those of each in a batch of its own.
  auto dir = corpus("packfwd", R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "one"}]}, {"role": "assistant", "content": "a blob"}]}
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "text only"}, {"role": "assistant", "content": "b"}]}
{"messages": [{"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "image", "image": "img/j_large.jpg"}, {"type": "image_url", "image_url": {"url": "img/i_exif6.jpg"}}]}, {"role": "assistant", "content": "c"}, {"role": "user", "content": [{"type": "image", "image": "img/b.png"}]}, {"role": "assistant", "content": "d"}]}
)");
  ax::init_model_dir("tiny-qwen2_5-vl", (dir / "model").string(), 1);
  fs::copy_file(kModel + "/chat_template.jinja", dir / "model/chat_template.jinja");
  auto tok = ax::load_hf_tokenizer((dir / "model").string());
  std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\n[model]\npath = \"model\"\n[data]\nsequence_len = 1024\n"
                                     "eval_fraction = 0.0\ncache = false\n[[datasets]]\ntype = \"chat_template\"\npath = \"data.jsonl\"\n";
  auto cfg = ax::load_config((dir / "run.toml").string(), {});
  auto data = ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), registry(), *tok, 0, ax::model_image_processor(cfg.model.path));
  REQUIRE(data.train.size() == 3);
  ax::Registry models;
  ax::register_builtins(models);
  ax::ModelLoadOptions o;
  o.dir = (dir / "model").string();
  o.kernels = std::make_shared<ax::KernelSet>(models, ax::KernelPreferences{}, ax::DeviceInfo{});
  auto model = ax::load_model(models, o);
  const int64_t S = 1024;
  ax::data::PackedRows all;
  all.rows = {{0, 1, 2}};
  const at::Tensor packed = model->forward(ax::data::make_batch(data.train, all, {0}, S, 0, data.collator.get()), true).logits;
  int64_t at = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    ax::data::PackedRows one;
    one.rows = {{k}};
    const int64_t n = static_cast<int64_t>(data.train[k].input_ids.size());
    const at::Tensor alone = model->forward(ax::data::make_batch(data.train, one, {0}, S, 0, data.collator.get()), true).logits;
    const at::Tensor a = alone[0].narrow(0, 0, n), p = packed[0].narrow(0, at, n);
    CHECK((a - p).abs().max().item<double>() <= 1e-4 * std::max(1.0, a.abs().max().item<double>()));
    at += n;
  }
  fs::remove_all(dir);
}

// streaming = true (core's chat_template stream): the rows read lazily give the prepared samples (ids, labels,
// pixels and grids), the pixels only when a sample is materialised; a stream seeked to a cursor continues at
// that row.
TEST_CASE("chat_template with images streamed: the prepared samples, in order; a seek continues at the cursor's row") {
  for (const std::string& entry : {std::string("type = \"chat_template\"\npath = \"openai.jsonl\"\nstreaming = true\n"),
                                   std::string("type = \"chat_template\"\npath = \"sharegpt.jsonl\"\nstreaming = true\n") + kShareGpt}) {
    CAPTURE(entry);
    auto prepared = open(entry, kChat);
    auto type = registry().get<ax::DatasetType>(ax::ProviderKind::dataset, "chat_template");
    const auto* streaming = dynamic_cast<const ax::StreamingDatasetType*>(type.get());
    REQUIRE(streaming);
    const ax::DatasetContext ctx{&tokenizer(), kChat + "/run.toml", kChat, kModel, ax::model_image_processor(kModel)};
    auto stream = streaming->open_stream(toml::parse(entry), ctx);
    std::vector<ax::StreamCursor> cursors;
    std::size_t i = 0, deferred = 0;
    for (ax::Sample s; cursors.push_back(stream->cursor()), stream->next(s); ++i) {
      CAPTURE(i);
      REQUIRE(i < prepared->size());
      if (s.materialise) {
        ++deferred;
        CHECK(s.extras.count("pixel_values") == 0);  // not decoded until the rank training it asks
        auto make = std::move(s.materialise);
        s.materialise = nullptr;
        make(s);
      }
      const ax::Sample want = prepared->get(i);
      CHECK(s.input_ids == want.input_ids);
      CHECK(s.labels == want.labels);
      REQUIRE(s.extras.size() == want.extras.size());
      for (const auto& [name, t] : want.extras) CHECK(at::equal(s.extras.at(name), t));
    }
    CHECK(i == prepared->size());
    CHECK(deferred > 0);
    const std::size_t k = i / 2;
    auto resumed = streaming->open_stream(toml::parse(entry), ctx);
    resumed->seek(cursors[k]);
    ax::Sample s;
    REQUIRE(resumed->next(s));
    CHECK(s.input_ids == prepared->get(k).input_ids);
  }
}
