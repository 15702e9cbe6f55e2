// End to end on the CPU, streamed: configs/qwen2_5-vl-mm-cpt-streaming.toml trains tiny-qwen2_5-vl over a
// generated corpus in two JSON Lines shards, reading rows (and decoding their images) only as training reaches
// them; a run resumed from a mid-stream checkpoint continues at the next row, decodes no image of an earlier
// row, and trains the same rows with the same losses as the uninterrupted run. The type is registered
// in-process so that the test reads this process's decode counter (mm_dataset.hpp).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "axengine/engine.hpp"
#include "axengine/models.hpp"
#include "axengine/registry.hpp"
#include "axengine/training.hpp"
#include "e2e_util.hpp"
#include "mm_dataset.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path scratch(const std::string& name) { return mm_e2e::scratch("mm_stream", name); }
using mm_e2e::lines;
using mm_e2e::steps_of;

void run(const fs::path& dir, std::vector<std::string> sets) {
  auto engine = mm_e2e::start_engine(dir, std::move(sets));
  ax::train_from_config(*engine, ax::TrainOptions{});
}

// The images of the rows from cursor `from` (inclusive) up to cursor `to` (inclusive: the row there was read as
// the packer's lookahead), over the shards in order; a cursor is (file, line).
int64_t images_between(const std::vector<fs::path>& shards, const json& from, const json& to) {
  int64_t n = 0;
  bool in = false;
  for (const auto& shard : shards) {
    std::ifstream f(shard);
    int64_t line = 0;
    for (std::string l; std::getline(f, l);) {
      ++line;
      if (shard.string() == from["file"].get<std::string>() && line == from["line"].get<int64_t>()) in = true;
      if (in && !l.empty()) n += static_cast<int64_t>(json::parse(l)["images"].size());
      if (shard.string() == to["file"].get<std::string>() && line == to["line"].get<int64_t>()) return n;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("mm_cpt e2e streaming: resumed mid-stream, the run decodes no earlier image and trains the same rows") {
  const fs::path dir = scratch("resume");
  const std::string cmd = std::string(MM_CPT_PYTHON) + " " + AXENGINE_SOURCE_DIR + "/scripts/make-mm-corpus.py " +
                          (dir / "data/mm").string() + " --rows 128 --shards 2 --seed 1 > " + (dir / "corpus.log").string() + " 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "make-mm-corpus.py failed (numpy and Pillow in AXENGINE_PYTHON?): ", cmd);
  ax::init_model_dir("tiny-qwen2_5-vl", (dir / "model").string(), 1);
  fs::create_directories(dir / "configs");
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/qwen2_5-vl-mm-cpt-streaming.toml", dir / "configs/mm.toml");
  const std::vector<fs::path> shards{dir / "data/mm/train-00000-of-00002.jsonl", dir / "data/mm/train-00001-of-00002.jsonl"};
  int64_t corpus_images = 0;
  for (const auto& s : shards)
    for (const auto& r : lines(s)) corpus_images += static_cast<int64_t>(r["images"].size());

  const std::vector<std::string> small = {"data.sequence_len=256", "train.micro_batch_size=2", "train.grad_accum=1",
                                          "train.lr=3e-3", "train.warmup_steps=2", "train.cpu_threads=1", "lora.dropout=0.0",
                                          "checkpoint.every_steps=4", "checkpoint.keep_last=10", "train.max_steps=8",
                                          "data.prefetch_steps=2"};  // read ahead: the cursors are still the trained rows'
  // 8 steps in one go, a checkpoint at step 4.
  auto full = small;
  full.push_back("run.output_dir=" + (dir / "full").string());
  uint64_t before = ax::mm::image_decodes();
  run(dir, full);
  const uint64_t full_decodes = ax::mm::image_decodes() - before;
  auto ref = steps_of(dir / "full/metrics.jsonl");
  REQUIRE(ref.size() == 8);
  const json c4 = json::parse(std::ifstream(dir / "full/checkpoints/step-00000004/trainer_state.json"))["data_stream"]["cursor"];
  const json c8 = json::parse(std::ifstream(dir / "full/checkpoints/step-00000008/trainer_state.json"))["data_stream"]["cursor"];
  CAPTURE(c4.dump());
  CAPTURE(c8.dump());
  REQUIRE(c8["pass"] == 0);  // 8 steps stay within the first pass: the counts below are of distinct rows
  // Lazily: the run decoded the images of the rows it read (through the lookahead row at its final cursor),
  // not the corpus.
  const json start{{"file", shards[0].string()}, {"line", 1}};
  CHECK(full_decodes == static_cast<uint64_t>(images_between(shards, start, c8)));
  CHECK(full_decodes < static_cast<uint64_t>(corpus_images));

  // Resumed from step 4 into a fresh output dir: it reads from step 4's cursor on, so it decodes exactly the
  // images of the rows from there to the same final cursor — none of a row before it.
  auto resume = small;
  resume.push_back("run.output_dir=" + (dir / "resumed").string());
  resume.push_back("checkpoint.resume_from=" + (dir / "full/checkpoints/step-00000004").string());
  before = ax::mm::image_decodes();
  run(dir, resume);
  const uint64_t resumed_decodes = ax::mm::image_decodes() - before;
  CHECK(resumed_decodes == static_cast<uint64_t>(images_between(shards, c4, c8)));
  CHECK(resumed_decodes < full_decodes);
  auto resumed = steps_of(dir / "resumed/metrics.jsonl");
  REQUIRE(resumed.size() == 4);  // steps 5..8
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const json& want = ref[i + 4];
    CHECK(resumed[i]["step"] == want["step"]);
    CHECK(resumed[i]["tokens"] == want["tokens"]);
    CHECK(resumed[i]["trainable_tokens"] == want["trainable_tokens"]);
    CHECK(resumed[i]["tokens_seen"] == want["tokens_seen"]);
    CHECK(resumed[i]["loss"].get<double>() == doctest::Approx(want["loss"].get<double>()).epsilon(1e-5));
  }
  const json r8 = json::parse(std::ifstream(dir / "resumed/checkpoints/step-00000008/trainer_state.json"))["data_stream"]["cursor"];
  CHECK(r8 == c8);
  // Image tokens are inputs, not targets.
  for (const auto& s : ref) CHECK(s["trainable_tokens"].get<int64_t>() < s["tokens"].get<int64_t>());
  fs::remove_all(dir);
}
