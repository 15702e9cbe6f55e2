// `axengine make-data / prepare / run` end to end on a tiny Llama. (Crash safety: crash_cli_test.cpp.)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "axengine/safetensors.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

using ax::test::run;
using ax::test::setup_run;
using ax::test::slurp;
using ax::test::step_records;

TEST_CASE("cli: make-data, prepare and run train a tiny llama end to end") {
  auto dir = setup_run("cli_run", "max_steps = 12\n[eval]\nevery_steps = 6\n[checkpoint]\nevery_steps = 6\n");
  CHECK(run({"prepare", "--config", (dir / "run.toml").string()}, dir / "prepare.log") == 0);
  CHECK(slurp(dir / "prepare.log").find("80 train / 20 eval samples (tokenised)") != std::string::npos);
  int rc = run({"run", "--config", (dir / "run.toml").string()}, dir / "run.log");
  std::string log = slurp(dir / "run.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("(prepared cache)") != std::string::npos);  // prepare's work reused
  CHECK(log.find("kernel backends for ") != std::string::npos);  // cpu here, sm_XX on a GPU machine
  CHECK(log.find("exact match") != std::string::npos);
  CHECK(log.find("peak memory") != std::string::npos);
  auto steps = step_records(dir / "out" / "metrics.jsonl");
  REQUIRE(steps.size() == 12);
  CHECK(steps.back()["loss"].get<double>() < steps.front()["loss"].get<double>());
  auto ck = dir / "out" / "checkpoints" / "step-00000012";
  CHECK(fs::is_regular_file(ck / "adapter_config.json"));
  CHECK_NOTHROW(ax::safetensors::File::open((ck / "adapter_model.safetensors").string()));
  CHECK(slurp(dir / "out" / "report.html").find("<svg") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("cli: a tokenizer id beyond the model's vocab_size is found by prepare and run, naming file:line") {
  // Every row ends with EOS (id 256); a config.json that says vocab_size 200 used to fail only in the forward
  // pass ("token ids must be in [0, 200)"), naming no row.
  auto dir = setup_run("cli_vocab", "max_steps = 2\n");
  std::string config = slurp(dir / "model" / "config.json");
  auto at = config.find("\"vocab_size\": ");
  REQUIRE(at != std::string::npos);
  config.replace(at, config.find(',', at) - at, "\"vocab_size\": 200");
  std::ofstream(dir / "model" / "config.json") << config;
  {  // a model of 200 tokens throughout (the checkpoint is checked against config.json before the data)
    auto file = ax::safetensors::File::open((dir / "model" / "model.safetensors").string());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& t : file->tensors()) {
      at::Tensor v = file->get(t.name);
      if (t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight") v = v.narrow(0, 0, 200).contiguous();
      tensors.emplace_back(t.name, v);
    }
    file.reset();
    ax::safetensors::save((dir / "model" / "model.safetensors").string(), tensors);
  }
  for (const char* command : {"prepare", "run"}) {
    CAPTURE(command);
    const auto log = dir / (std::string(command) + ".log");
    CHECK(run({command, "--config", (dir / "run.toml").string()}, log) == 2);
    std::string text = slurp(log);
    INFO(text);
    CHECK(text.find("data/train.jsonl:1: token ") != std::string::npos);
    CHECK(text.find("is beyond the model's vocabulary (config.json vocab_size 200; the tokenizer has ") != std::string::npos);
  }
  ax::test::remove_tree(dir);
}
