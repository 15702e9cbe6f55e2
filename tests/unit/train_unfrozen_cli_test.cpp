// `axengine validate / run` with [train] unfrozen_parameters on a tiny Llama: what validate refuses (exit 2), a
// full fine-tune without LoRA (lora.targets = []) whose checkpoints are full model directories, and its --resume
// from a checkpoint, bitwise. (Step-for-step parity with transformers: train_unfrozen_test.cpp.)
#include <doctest/doctest.h>

#include <filesystem>

#include "axengine/safetensors.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

using ax::test::run;
using ax::test::setup_run;
using ax::test::slurp;

TEST_CASE("cli: validate refuses unfrozen_parameters that match nothing, and a run where nothing trains") {
  auto dir = setup_run("cli_unfrozen_validate", "max_steps = 2\n");
  const std::string cfg = (dir / "run.toml").string();
  CHECK(run({"validate", "--config", cfg, "--set", "train.unfrozen_parameters=[\"^lm_head.weight$\", \"^model.nothing\"]"},
            dir / "v1.log") == 2);
  CHECK(slurp(dir / "v1.log").find("train.unfrozen_parameters: '^model.nothing' matches no parameter") != std::string::npos);
  CHECK(run({"validate", "--config", cfg, "--set", "lora.targets=[]"}, dir / "v2.log") == 2);
  CHECK(slurp(dir / "v2.log").find("nothing would train") != std::string::npos);
  CHECK(run({"validate", "--config", cfg, "--set", "train.unfrozen_parameters=[\"^lm_head.weight$\"]"}, dir / "v3.log") == 0);
  CHECK(slurp(dir / "v3.log").find("1 base parameters unfrozen") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("cli: a full fine-tune (unfrozen_parameters = [\".*\"], no LoRA) writes full model checkpoints and resumes bitwise") {
  auto dir = setup_run("cli_unfrozen_run", "max_steps = 6\nunfrozen_parameters = [\".*\"]\n[checkpoint]\nevery_steps = 3\nkeep_last = 5\n");
  const std::vector<std::string> args{"run", "--config", (dir / "run.toml").string(), "--set", "lora.targets=[]"};
  int rc = run(args, dir / "run.log");
  std::string log = slurp(dir / "run.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("written as full model directories") != std::string::npos);
  const fs::path ck = dir / "out" / "checkpoints";
  for (const char* step : {"step-00000003", "step-00000006"}) {
    CAPTURE(step);
    CHECK(fs::is_regular_file(ck / step / "model.safetensors"));
    CHECK(fs::is_regular_file(ck / step / "config.json"));
    CHECK(!fs::exists(ck / step / "adapter_config.json"));
  }
  // The checkpoint of step 6 taken away, --resume trains steps 4..6 again from step 3's: the same bytes.
  const auto want_model = slurp(ck / "step-00000006" / "model.safetensors");
  const auto want_state = slurp(ck / "step-00000006" / "trainer_state.safetensors");
  CHECK(want_model != slurp(ck / "step-00000003" / "model.safetensors"));
  ax::test::remove_tree(ck / "step-00000006");
  std::vector<std::string> resume = args;
  resume.push_back("--resume");
  rc = run(resume, dir / "resume.log");
  log = slurp(dir / "resume.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("step-00000003") != std::string::npos);
  CHECK(slurp(ck / "step-00000006" / "model.safetensors") == want_model);
  CHECK(slurp(ck / "step-00000006" / "trainer_state.safetensors") == want_state);
  ax::test::remove_tree(dir);
}
