// No setting is silently ignored (issue 36): a continued adapter's own settings against [lora] keys written beside
// lora.init_from, [eval] keys with no eval rows, and --set on one [[datasets]] entry, each through validate and run.
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "test_util.hpp"
#include "unit/tiny_model.hpp"

using namespace ax_test;

namespace {

std::string env(const TempDir& dir) { return "AXENGINE_CACHE_DIR=" + (dir / "cache") + " OMP_NUM_THREADS=1 "; }

// A tiny Llama, one-digit sums and a 1-step LoRA run (r = 4, alpha = 8) whose adapter the cases continue.
std::string config(const std::string& eval_path_line, const std::string& lora) {
  return "[run]\noutput_dir = \"out\"\n[model]\npath = \"model\"\n[data]\nsequence_len = 64\n"
         "[[datasets]]\ntype = \"completion\"\npath = \"data/train.jsonl\"\n" + eval_path_line +
         "prompt_field = \"prompt\"\ntext_field = \"answer\"\n[lora]\n" + lora +
         "[train]\nmax_steps = 1\nmicro_batch_size = 2\ncpu_threads = 1\n[eval]\nexact_match = false\n";
}

void make_run_dir(const TempDir& dir) {
  ax::test::make_tiny_llama(dir.path / "model");
  REQUIRE(run(env(dir) + axengine() + " make-data --task arithmetic --digits 1 --train 40 --eval 8 --out " + (dir / "data")).exit_code == 0);
}

std::string line_with(const std::string& output, const std::string& needle) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) return line;
  return "";
}

// validate and run both exit 2 with the same line holding `expect`.
void check_refused(const TempDir& dir, const std::string& args, const std::string& expect) {
  auto v = run(env(dir) + axengine() + " validate --overwrite --config " + (dir / "run.toml") + " " + args);
  auto r = run(env(dir) + axengine() + " run --overwrite --config " + (dir / "run.toml") + " " + args);
  INFO("validate: " << v.output);
  INFO("run: " << r.output);
  CHECK(v.exit_code == 2);
  CHECK(r.exit_code == 2);
  const std::string line = line_with(v.output, expect);
  CHECK(!line.empty());
  CHECK(line == line_with(r.output, expect));
}

}  // namespace

TEST_CASE("settings cli: [lora] keys beside lora.init_from must agree with the adapter it continues") {
  TempDir dir;
  make_run_dir(dir);
  const std::string eval = "eval_path = \"data/eval.jsonl\"\n";
  write_file(dir / "run.toml", config(eval, "r = 4\nalpha = 8\n"));
  REQUIRE(run(env(dir) + axengine() + " run --config " + (dir / "run.toml")).exit_code == 0);
  const std::string adapter = dir / "out/checkpoints/step-00000001";
  REQUIRE(std::filesystem::exists(adapter + "/adapter_config.json"));
  const std::string from = "init_from = \"" + adapter + "\"\n";

  // Restating the adapter's own settings is fine; so is leaving them out.
  for (const std::string& lora : {from, from + "r = 4\nalpha = 8\ndropout = 0.0\nrslora = false\n"}) {
    write_file(dir / "run.toml", config(eval, lora));
    auto v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " --overwrite");
    INFO(v.output);
    CHECK(v.exit_code == 0);
    CHECK(v.output.find("(continuing " + adapter + ")") != std::string::npos);
  }
  write_file(dir / "run.toml", config(eval, from + "r = 8\n"));
  check_refused(dir, "", "'lora.r' is 8, but the adapter lora.init_from continues was trained with r = 4 (" + adapter +
                             "/adapter_config.json): a continued adapter keeps its own settings, as peft's "
                             "PeftModel.from_pretrained does; remove lora.r or start a fresh adapter without init_from");
  write_file(dir / "run.toml", config(eval, from));
  check_refused(dir, "--set lora.alpha=16", "'lora.alpha' is 16, but the adapter lora.init_from continues was trained with lora_alpha = 8");
  check_refused(dir, "--set lora.dropout=0.1", "'lora.dropout' is 0.1, but");
  check_refused(dir, "--set lora.rslora=true", "'lora.rslora' is true, but");
  check_refused(dir, "--set 'lora.targets=[\"q_proj\"]'", "'lora.targets' is [\"q_proj\"], but");
}

TEST_CASE("settings cli: [eval] keys that ask for evaluation are refused when there are no eval rows") {
  TempDir dir;
  make_run_dir(dir);
  write_file(dir / "run.toml", config("", "r = 4\nalpha = 8\n"));  // no eval_path, no eval_fraction
  // Nothing asks for evaluation: fine.
  auto v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml"));
  INFO(v.output);
  CHECK(v.exit_code == 0);
  CHECK(run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " --set eval.every_steps=0").exit_code == 0);
  check_refused(dir, "--set eval.every_steps=5",
                "'eval.every_steps' is set, but the data has no eval rows: nothing would be evaluated (give a [[datasets]] "
                "entry an eval_path or eval_fraction, or set data.eval_fraction > 0; or remove it)");
  check_refused(dir, "--set eval.max_rows=4", "'eval.max_rows' is set, but the data has no eval rows");
  check_refused(dir, "--set eval.exact_match=true", "'eval.exact_match' is set, but the data has no eval rows");
  // With eval rows the same keys are fine.
  v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " --set eval.every_steps=5 --set data.eval_fraction=0.25");
  INFO(v.output);
  CHECK(v.exit_code == 0);
}

TEST_CASE("settings cli: --set datasets[0].path reaches the entry in validate and run") {
  TempDir dir;
  make_run_dir(dir);
  write_file(dir / "run.toml", config("eval_path = \"data/eval.jsonl\"\n", "r = 4\nalpha = 8\n"));
  // The entry's path replaced: a file that is not there is reported as that entry's, with the --set as its source.
  check_refused(dir, "--set 'datasets[0].path=data/nope.jsonl'", "datasets[0].path: " + (dir / "data/nope.jsonl") + " does not exist");
  std::filesystem::copy_file(dir / "data/train.jsonl", dir / "data/other.jsonl");
  auto r = run(env(dir) + axengine() + " run --config " + (dir / "run.toml") + " --set 'datasets[0].path=data/other.jsonl'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("other.jsonl") != std::string::npos);
  // An index past the entries is a usage error naming how many there are.
  auto v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " --set 'datasets[1].path=x.jsonl'");
  CHECK(v.exit_code == 2);
  CHECK(v.output.find("index 1 is out of range: 'datasets' has 1 entry (datasets[0] to datasets[0])") != std::string::npos);
}
