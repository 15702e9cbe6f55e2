// End to end on the CPU, streamed, two data-parallel ranks (`axengine launch --nproc 2`, Gloo): each rank
// decodes only the images of the rows it trains (Sample::materialise left to the owning rank, on the prefetch
// thread), and the two ranks train what one process accumulating the same micro-batches (grad_accum 2) trains:
// the same losses (fp32 round-off: the ranks' gradient sums run in another order) and token counts, the same
// final cursor. The plugin is the built one beside the executable (AXENGINE_BIN), as `axengine run` finds it.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "axengine/models.hpp"
#include "e2e_util.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using mm_e2e::slurp;

// `axengine <args>` with the streaming config and `sets`; its output in dir/<log>; the exit code.
int axengine(const fs::path& dir, const std::string& args, const std::vector<std::string>& sets, const std::string& log) {
  std::string cmd = std::string(AXENGINE_BIN) + " " + args + " --config " + (dir / "configs/mm.toml").string();
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  cmd += " > " + (dir / log).string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) MESSAGE(cmd, "\n", slurp(dir / log));
  return rc;
}

}  // namespace

TEST_CASE("mm_cpt e2e streaming: 2 ranks, each decoding its own rows, train what 1 process with grad_accum 2 trains") {
  const fs::path dir = mm_e2e::scratch("mm_dist", "two");
  const std::string cmd = std::string(MM_CPT_PYTHON) + " " + AXENGINE_SOURCE_DIR + "/scripts/make-mm-corpus.py " +
                          (dir / "data/mm").string() + " --rows 48 --shards 2 --seed 5 > " + (dir / "corpus.log").string() + " 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "make-mm-corpus.py failed (numpy and Pillow in AXENGINE_PYTHON?): ", cmd);
  ax::init_model_dir("tiny-qwen2_5-vl", (dir / "model").string(), 1);
  fs::create_directories(dir / "configs");
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/qwen2_5-vl-mm-cpt-streaming.toml", dir / "configs/mm.toml");
  const std::vector<std::string> common = {
      "model.path=" + (dir / "model").string(), "data.sequence_len=256", "train.micro_batch_size=1", "train.lr=3e-3",
      "train.warmup_steps=2", "train.cpu_threads=1", "lora.dropout=0.0", "train.max_steps=5", "checkpoint.every_steps=0",
      "device.type=cpu", "distributed.timeout_s=60", "data.prefetch_steps=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return more;
  };
  REQUIRE(axengine(dir, "run", with({"train.grad_accum=2", "run.output_dir=" + (dir / "one").string()}), "one.log") == 0);
  REQUIRE(axengine(dir, "launch --nproc 2 -- run", with({"train.grad_accum=1", "run.output_dir=" + (dir / "two").string()}),
                   "two.log") == 0);
  CHECK(slurp(dir / "two.log").find("launch: all 2 ranks finished") != std::string::npos);
  CHECK(slurp(dir / "two.log").find("each of the 2 ranks packs every row and materialises (decodes) only its own") != std::string::npos);
  const auto one = mm_e2e::steps_of(dir / "one/metrics.jsonl"), two = mm_e2e::steps_of(dir / "two/metrics.jsonl");
  REQUIRE(one.size() == 5);
  REQUIRE(two.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(two[i]["tokens"] == one[i]["tokens"]);
    CHECK(two[i]["trainable_tokens"] == one[i]["trainable_tokens"]);
    CHECK(two[i]["loss"].get<double>() == doctest::Approx(one[i]["loss"].get<double>()).epsilon(1e-5));
  }
  auto cursor = [&](const char* out) {
    return json::parse(std::ifstream(dir / out / "checkpoints/step-00000005/trainer_state.json"))["data_stream"]["cursor"];
  };
  CHECK(cursor("two") == cursor("one"));
  fs::remove_all(dir);
}
