// End to end on the CPU: the shipped configs/qwen2_5-vl-mm-cpt.toml trains a LoRA on the language model of a
// tiny random Qwen2.5-VL (`init-model --preset tiny-qwen2_5-vl`) over a generated image + text corpus
// (scripts/make-mm-corpus.py) through the engine API, as `axengine run` does; and a resumed run decodes no image
// again and counts its tokens on. The type is registered in-process (not loaded as the .so) so that the
// test reads this process's decode counter (mm_dataset.hpp).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

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

fs::path scratch(const std::string& name) { return mm_e2e::scratch("mm_e2e", name); }
using mm_e2e::lines;
using mm_e2e::steps_of;

// The layout the shipped config assumes, relative to configs/: ../data/mm/train.jsonl; the model beside it.
// Returns the number of images the corpus holds.
int64_t make_layout(const fs::path& dir, int rows) {
  const std::string cmd = std::string(MM_CPT_PYTHON) + " " + AXENGINE_SOURCE_DIR + "/scripts/make-mm-corpus.py " +
                          (dir / "data/mm").string() + " --rows " + std::to_string(rows) + " --seed 1 > " +
                          (dir / "corpus.log").string() + " 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "make-mm-corpus.py failed (numpy and Pillow in AXENGINE_PYTHON?): ", cmd);
  ax::init_model_dir("tiny-qwen2_5-vl", (dir / "model").string(), 1);
  fs::create_directories(dir / "configs");
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/qwen2_5-vl-mm-cpt.toml", dir / "configs/mm.toml");
  int64_t images = 0;
  for (const auto& r : lines(dir / "data/mm/train.jsonl")) images += static_cast<int64_t>(r["images"].size());
  return images;
}

// One `axengine run` in this process: the engine without plugin discovery, the type registered by hand.
void run(const fs::path& dir, std::vector<std::string> sets, bool resume) {
  auto engine = mm_e2e::start_engine(dir, std::move(sets));
  ax::TrainOptions t;
  t.resume = resume;
  ax::train_from_config(*engine, t);
}

// The shipped config cut to a CPU test: short rows, one sample per micro-batch pair, a quick schedule.
const std::vector<std::string> kSmall = {"data.sequence_len=256", "train.micro_batch_size=2", "train.grad_accum=1",
                                         "train.lr=3e-3",         "train.warmup_steps=2",     "train.cpu_threads=1",
                                         "eval.every_steps=0",    "lora.dropout=0.0"};

}  // namespace

TEST_CASE("mm_cpt e2e: the shipped config trains tiny-qwen2_5-vl with LoRA on generated images on CPU, loss falls") {
  const fs::path dir = scratch("train");
  ::setenv("AXENGINE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const int64_t images = make_layout(dir, 48);
  auto sets = kSmall;
  sets.push_back("train.max_steps=40");
  const uint64_t before = ax::mm::image_decodes();
  run(dir, sets, false);
  // Every image decoded once (the train rows and the 2 % held out for eval), by the prepare step.
  CHECK(ax::mm::image_decodes() - before == static_cast<uint64_t>(images));
  const fs::path out = dir / "runs/qwen2_5-vl-mm-cpt";
  auto steps = steps_of(out / "metrics.jsonl");
  REQUIRE(steps.size() == 40);
  auto mean = [&](std::size_t from) {
    double s = 0;
    for (std::size_t i = from; i < from + 5; ++i) s += steps[i]["loss"].get<double>();
    return s / 5;
  };
  MESSAGE("mean loss, steps 1-5: ", mean(0), ", steps 36-40: ", mean(35));
  CHECK(mean(35) < 0.7 * mean(0));  // 7.71 -> 4.83 today (the template is learnt; the colours, shapes, widths are random)
  // Image tokens are inputs, not targets: every step trains on fewer tokens than it feeds.
  for (const auto& s : steps) CHECK(s["trainable_tokens"].get<int64_t>() < s["tokens"].get<int64_t>());
  // The adapter is peft's, on the language model only.
  json ac = json::parse(std::ifstream(out / "checkpoints/step-00000040/adapter_config.json"));
  CHECK(ac["exclude_modules"] == ".*visual.*");
  fs::remove_all(dir);
}

TEST_CASE("mm_cpt e2e: a resumed run decodes no image again (prepared cache) and carries its token counts") {
  const fs::path dir = scratch("resume");
  ::setenv("AXENGINE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const int64_t images = make_layout(dir, 16);
  auto sets = kSmall;
  // 2 of the 16 samples held out: the shipped 2 % holds none out of so few, and [eval] asks for evaluation.
  sets.push_back("data.eval_fraction=0.125");
  sets.push_back("checkpoint.keep_last=10");
  sets.push_back("checkpoint.every_steps=4");
  sets.push_back("train.max_steps=8");

  // 8 steps in one go, a checkpoint at step 4: the reference, and the checkpoint to resume from.
  auto full = sets;
  full.push_back("run.output_dir=" + (dir / "full").string());
  uint64_t before = ax::mm::image_decodes();
  run(dir, full, false);
  CHECK(ax::mm::image_decodes() - before == static_cast<uint64_t>(images));  // prepared once, cache written
  auto ref = steps_of(dir / "full/metrics.jsonl");
  REQUIRE(ref.size() == 8);
  const std::string step4 = (dir / "full/checkpoints/step-00000004").string();

  // Resumed from step 4 into a fresh output dir (no metrics.jsonl to recount from): the prepared cache serves
  // every sample and the trainer's cursor is the step, so no image is decoded again, those trained on included.
  auto resume = sets;
  resume.push_back("run.output_dir=" + (dir / "resumed").string());
  resume.push_back("checkpoint.resume_from=" + step4);
  before = ax::mm::image_decodes();
  run(dir, resume, false);
  CHECK(ax::mm::image_decodes() - before == 0);
  auto resumed = steps_of(dir / "resumed/metrics.jsonl");
  REQUIRE(resumed.size() == 4);  // steps 5..8
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const json& want = ref[i + 4];
    CHECK(resumed[i]["step"] == want["step"]);
    // The same rows in the same order, the running counts taken from the checkpoint (trainer_state.json).
    CHECK(resumed[i]["tokens"] == want["tokens"]);
    CHECK(resumed[i]["trainable_tokens"] == want["trainable_tokens"]);
    CHECK(resumed[i]["tokens_seen"] == want["tokens_seen"]);
    CHECK(resumed[i]["trainable_tokens_seen"] == want["trainable_tokens_seen"]);
    CHECK(resumed[i]["loss"].get<double>() == doctest::Approx(want["loss"].get<double>()).epsilon(1e-5));
  }
  json s4 = json::parse(std::ifstream(step4 + "/trainer_state.json"));
  json s8 = json::parse(std::ifstream(dir / "resumed/checkpoints/step-00000008/trainer_state.json"));
  CHECK(s4["tokens_seen"] == ref[3]["tokens_seen"]);
  CHECK(s8["tokens_seen"] == ref[7]["tokens_seen"]);
  CHECK(s8["trainable_tokens_seen"] == ref[7]["trainable_tokens_seen"]);
  CHECK(ref[7]["tokens_seen"].get<int64_t>() > ref[3]["tokens_seen"].get<int64_t>());

  // Without the cache (data.cache = false) a resume prepares, so decodes, every row again: map-style data is
  // prepared whole before the first step (docs/plugins/mm_cpt.md, "Not yet").
  resume.push_back("data.cache=false");
  resume.push_back("run.output_dir=" + (dir / "resumed_nocache").string());
  before = ax::mm::image_decodes();
  run(dir, resume, false);
  CHECK(ax::mm::image_decodes() - before == static_cast<uint64_t>(images));
  CHECK(steps_of(dir / "resumed_nocache/metrics.jsonl").back()["tokens_seen"] == ref[7]["tokens_seen"]);
  fs::remove_all(dir);
}
