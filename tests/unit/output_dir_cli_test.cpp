// `axengine run` into an output_dir a previous run left: refused without --resume / --overwrite (two runs
// would mix), --overwrite replaces only the run's own outputs; and the adapter names its base model.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

using ax::test::run;
using ax::test::setup_run;
using ax::test::slurp;

TEST_CASE("cli: a fresh run into a non-empty output_dir is refused; --overwrite replaces the run's outputs only") {
  auto dir = setup_run("cli_output_dir", "max_steps = 2\n[checkpoint]\nevery_steps = 2\n");
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run({"run", "--config", cfg}, dir / "first.log") == 0);

  // adapter_config.json names the base (absolute), so peft's AutoPeftModelForCausalLM can load it.
  const auto adapter = nlohmann::json::parse(slurp(dir / "out/checkpoints/step-00000002/adapter_config.json"));
  CHECK(adapter["base_model_name_or_path"] == fs::absolute(dir / "model").lexically_normal().string());

  for (const char* command : {"validate", "run"}) {
    CAPTURE(command);
    CHECK(run({command, "--config", cfg}, dir / "again.log") == 2);
    const std::string log = slurp(dir / "again.log");
    INFO(log);
    CHECK(log.find("run.output_dir " + (dir / "out").string() + " is not empty (a previous run's output?); continue it "
                   "with --resume, start over in it with --overwrite") != std::string::npos);
  }
  CHECK(run({"run", "--config", cfg, "--resume", "--overwrite"}, dir / "both.log") == 2);
  CHECK(slurp(dir / "both.log").find("--overwrite starts afresh but the run resumes") != std::string::npos);

  std::ofstream(dir / "out/notes.txt") << "mine\n";  // not the run's: --overwrite leaves it
  CHECK(run({"validate", "--config", cfg, "--overwrite"}, dir / "validate.log") == 0);
  REQUIRE(run({"run", "--config", cfg, "--overwrite", "--set", "train.max_steps=1", "--set", "train.warmup_steps=0",
                "--set", "checkpoint.every_steps=1"},
              dir / "overwrite.log") == 0);
  CHECK(slurp(dir / "overwrite.log").find("--overwrite: removing " + (dir / "out/checkpoints").string()) != std::string::npos);
  CHECK(fs::exists(dir / "out/notes.txt"));
  CHECK(fs::exists(dir / "out/checkpoints/step-00000001"));
  CHECK_FALSE(fs::exists(dir / "out/checkpoints/step-00000002"));  // the first run's checkpoint is gone
  CHECK(ax::test::step_records(dir / "out/metrics.jsonl").size() == 1);
  ax::test::remove_tree(dir);
}
