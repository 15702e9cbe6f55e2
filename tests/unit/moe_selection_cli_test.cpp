// Per-GPU MoE backend selection from a run config (issue 36): [kernels] moe_mlp and its [kernels.arch.sm_XX] form
// choose the moe.mlp backend that `plugins explain` shows and that a run calls (the test plugin's two backends log
// the calls they serve); [kernels] moe and dequant, which no model calls, are refused naming the key that chooses.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "test_util.hpp"

using namespace ax_test;

namespace {

std::string env(const TempDir& dir) { return "AXENGINE_CACHE_DIR=" + (dir / "cache") + " OMP_NUM_THREADS=1 "; }

std::string pick_plugin() { return std::string(AXENGINE_TEST_PLUGIN_DIR) + "/selection/axengine_test_moe_pick.so"; }

// A tiny Qwen3-MoE trained one step with pick_a chosen everywhere but on sm_90, where pick_b is.
void make_run_dir(const TempDir& dir) {
  REQUIRE(run(env(dir) + axengine() + " init-model --preset tiny-qwen3-moe --out " + (dir / "model")).exit_code == 0);
  REQUIRE(run(env(dir) + axengine() + " make-data --task arithmetic --digits 1 --train 40 --eval 8 --out " + (dir / "data"))
              .exit_code == 0);
  write_file(dir / "run.toml",
             "[run]\noutput_dir = \"out\"\n[device]\ntype = \"cpu\"\n[model]\npath = \"model\"\n[plugins]\npaths = [\"" + pick_plugin() + "\"]\n"
             "[data]\nsequence_len = 64\n"
             "[[datasets]]\ntype = \"completion\"\npath = \"data/train.jsonl\"\neval_path = \"data/eval.jsonl\"\n"
             "prompt_field = \"prompt\"\ntext_field = \"answer\"\n"
             "[lora]\nr = 4\nalpha = 8\ntargets = [\"q_proj\", \"gate_up_proj\"]\n"
             "[train]\nmax_steps = 1\nmicro_batch_size = 2\ncpu_threads = 1\n[eval]\nexact_match = false\n"
             "[kernels]\nmoe_mlp = [\"pick_a\", \"reference\"]\n"
             "[kernels.arch.sm_90]\nmoe_mlp = [\"pick_b\", \"reference\"]\n");
}

// The explain line of moe.mlp: "  moe.mlp  <backend>  <query> from <list>".
std::string moe_mlp_line(const std::string& output) {
  const auto at = output.find("\n  moe.mlp ");
  if (at == std::string::npos) return "";
  return output.substr(at + 1, output.find('\n', at + 1) - at - 1);
}

}  // namespace

TEST_CASE("moe selection cli: kernels.moe_mlp and its per-GPU form choose the backend explain shows and the run calls") {
  TempDir dir;
  make_run_dir(dir);
  const std::string cfg = " --config " + (dir / "run.toml");

  // explain: the CPU takes [kernels]; sm_90 its own list; sm_120 has none and takes [kernels].
  auto e = run(env(dir) + axengine() + " plugins explain" + cfg);
  INFO(e.output);
  CHECK(e.exit_code == 0);
  CHECK(moe_mlp_line(e.output).find("pick_a") != std::string::npos);
  CHECK(moe_mlp_line(e.output).find("from [kernels]") != std::string::npos);
  e = run("AXENGINE_ARCH=sm_90 " + env(dir) + axengine() + " plugins explain" + cfg);
  INFO(e.output);
  CHECK(moe_mlp_line(e.output).find("pick_b") != std::string::npos);
  CHECK(moe_mlp_line(e.output).find("from [kernels.arch.sm_90]") != std::string::npos);
  e = run("AXENGINE_ARCH=sm_120 " + env(dir) + axengine() + " plugins explain" + cfg);
  INFO(e.output);
  CHECK(moe_mlp_line(e.output).find("pick_a") != std::string::npos);
  // --set on the per-GPU key changes that GPU's choice only.
  e = run("AXENGINE_ARCH=sm_90 " + env(dir) + axengine() + " plugins explain" + cfg +
          " --set 'kernels.arch.sm_90.moe_mlp=[\"pick_a\"]'");
  INFO(e.output);
  CHECK(moe_mlp_line(e.output).find("pick_a") != std::string::npos);

  // The run on the CPU calls what explain showed, forward and backward, and nothing else.
  auto r = run(env(dir) + axengine() + " run" + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("done: 1 steps") != std::string::npos);
  CHECK(r.output.find("test_moe_pick: pick_a served a moe.mlp forward") != std::string::npos);
  CHECK(r.output.find("test_moe_pick: pick_a served a moe.mlp backward") != std::string::npos);
  CHECK(r.output.find("pick_b served") == std::string::npos);

  // Changing the key changes the kernel the run uses.
  r = run(env(dir) + axengine() + " run --overwrite" + cfg + " --set 'kernels.moe_mlp=[\"pick_b\"]'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("test_moe_pick: pick_b served a moe.mlp forward") != std::string::npos);
  CHECK(r.output.find("test_moe_pick: pick_b served a moe.mlp backward") != std::string::npos);
  CHECK(r.output.find("pick_a served") == std::string::npos);
}

TEST_CASE("moe selection cli: [kernels] moe and dequant, which no model calls, are refused naming the key that chooses") {
  TempDir dir;
  make_run_dir(dir);
  const std::string cfg = " --config " + (dir / "run.toml");
  struct Case {
    std::string set, expect;
  };
  const Case cases[] = {
      {"'kernels.moe=[\"reference\"]'",
       "'kernels.moe' would choose a moe.experts backend, but no model calls moe.experts: every MoE model calls moe.mlp, "
       "the whole expert block, and its backend runs its own expert kernels; choose the kernel with 'kernels.moe_mlp'"},
      {"'kernels.arch.sm_90.moe=[\"reference\"]'", "choose the kernel with 'kernels.arch.sm_90.moe_mlp'"},
      {"'kernels.dequant=[\"reference\"]'",
       "no model calls dequant: packed weights are decoded inside the linear_lora and moe_mlp backends; choose the kernel "
       "with 'kernels.linear_lora' or 'kernels.moe_mlp'"},
      {"'kernels.arch.sm_120.dequant=[\"reference\"]'", "'kernels.arch.sm_120.linear_lora' or 'kernels.arch.sm_120.moe_mlp'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.set);
    for (const char* cmd : {" validate", " run", " plugins explain"}) {
      auto r = run(env(dir) + axengine() + cmd + cfg + " --set " + c.set);
      INFO(r.output);
      CHECK(r.exit_code == 2);
      CHECK(r.output.find(c.expect) != std::string::npos);
    }
  }
  CHECK(!std::filesystem::exists(dir.path / "out/checkpoints"));
}
