// End to end on the CPU, streamed with the steps' rows read and their images decoded on a background thread
// (data.prefetch_steps; core/src/train/stream_prefetch.hpp): a run at depth 2 trains bitwise the same losses,
// decodes exactly the same images (none beyond the run's last step) and ends at the same cursor as one at
// depth 0; a missing image under on_bad_row = "error" stops both at the same step with the same message,
// naming the row and the file. The type is registered in-process (e2e_util.hpp) for the decode counter.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/training.hpp"
#include "e2e_util.hpp"
#include "mm_dataset.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A scratch dir with a two-shard corpus of 48 rows, the tiny model and the shipped streaming config.
fs::path make_run_dir(const std::string& name) {
  const fs::path dir = mm_e2e::scratch("mm_prefetch", name);
  const std::string cmd = std::string(MM_CPT_PYTHON) + " " + AXENGINE_SOURCE_DIR + "/scripts/make-mm-corpus.py " +
                          (dir / "data/mm").string() + " --rows 48 --shards 2 --seed 3 > " + (dir / "corpus.log").string() + " 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "make-mm-corpus.py failed (numpy and Pillow in AXENGINE_PYTHON?): ", cmd);
  ax::init_model_dir("tiny-qwen2_5-vl", (dir / "model").string(), 1);
  fs::create_directories(dir / "configs");
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/qwen2_5-vl-mm-cpt-streaming.toml", dir / "configs/mm.toml");
  return dir;
}

std::vector<std::string> settings(const fs::path& out, int depth) {
  return {"data.sequence_len=256", "train.micro_batch_size=2", "train.grad_accum=1", "train.lr=3e-3",
          "train.warmup_steps=2", "train.cpu_threads=1", "lora.dropout=0.0", "checkpoint.every_steps=3",
          "checkpoint.keep_last=10", "train.max_steps=6",
          "data.prefetch_steps=" + std::to_string(depth), "run.output_dir=" + out.string()};
}

json cursor_at(const fs::path& out, const char* step) {
  return json::parse(std::ifstream(out / "checkpoints" / step / "trainer_state.json"))["data_stream"];
}

}  // namespace

TEST_CASE("mm_cpt e2e streaming: prefetch depth 2 trains, decodes and checkpoints bitwise as depth 0") {
  const fs::path dir = make_run_dir("same");
  std::vector<json> steps[2];
  uint64_t decodes[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int depth = i * 2;
    CAPTURE(depth);
    const uint64_t before = ax::mm::image_decodes();
    auto engine = mm_e2e::start_engine(dir, settings(dir / ("out" + std::to_string(depth)), depth));
    ax::train_from_config(*engine, ax::TrainOptions{});
    decodes[i] = ax::mm::image_decodes() - before;
    steps[i] = mm_e2e::steps_of(dir / ("out" + std::to_string(depth)) / "metrics.jsonl");
    REQUIRE(steps[i].size() == 6);
  }
  // The worker makes the run's steps and no more: not one image beyond what depth 0 decodes.
  CHECK(decodes[0] > 0);
  CHECK(decodes[1] == decodes[0]);
  for (std::size_t s = 0; s < 6; ++s) {
    CAPTURE(s);
    for (const char* k : {"loss", "grad_norm", "tokens", "trainable_tokens", "tokens_seen"}) CHECK(steps[1][s][k] == steps[0][s][k]);
    CHECK(steps[1][s].contains("data_wait_s"));
  }
  for (const char* step : {"step-00000003", "step-00000006"}) {
    CAPTURE(step);
    CHECK(cursor_at(dir / "out2", step) == cursor_at(dir / "out0", step));
  }
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt e2e streaming: a missing image stops a prefetched run at its step, naming the row and the file") {
  const fs::path dir = make_run_dir("bad");
  // on_bad_row = "error" (the shipped config skips), and the image of the second shard's fourth row removed:
  // well after step 1, within the run's 6 steps of 2 rows.
  {
    std::ifstream in(dir / "configs/mm.toml");
    std::string t((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = "on_bad_row = \"skip\"";
    REQUIRE(t.find(from) != std::string::npos);
    t.replace(t.find(from), from.size(), "on_bad_row = \"error\"");
    std::ofstream(dir / "configs/mm.toml") << t;
  }
  const fs::path shard = dir / "data/mm/train-00000-of-00002.jsonl";
  const auto rows = mm_e2e::lines(shard);
  REQUIRE(rows.size() > 8);
  const std::string image = rows[7]["images"][0].get<std::string>();
  fs::remove(dir / "data/mm" / image);
  std::string msg[2];
  std::size_t trained[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int depth = i * 2;
    CAPTURE(depth);
    const fs::path out = dir / ("out" + std::to_string(depth));
    auto engine = mm_e2e::start_engine(dir, settings(out, depth));
    try {
      ax::train_from_config(*engine, ax::TrainOptions{});
      FAIL("the run did not stop");
    } catch (const ax::UsageError& e) {
      msg[i] = e.what();
    }
    trained[i] = mm_e2e::steps_of(out / "metrics.jsonl").size();
  }
  CAPTURE(msg[0]);
  CHECK(msg[0].find(shard.string() + ":8") != std::string::npos);  // the row
  CHECK(msg[0].find(fs::path(image).filename().string()) != std::string::npos);  // the file
  CHECK(msg[1] == msg[0]);
  CHECK(trained[0] >= 1);
  CHECK(trained[1] == trained[0]);  // reached at its step, not when the worker read it
  fs::remove_all(dir);
}
