// The run directory the validate tests start from: a tiny Llama, the one-digit sums task and a config that
// trains a LoRA on them for two steps (validate_cli_test.cpp, validate_start_cli_test.cpp).
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "test_util.hpp"
#include "unit/tiny_model.hpp"

namespace ax_test {

// The environment every command runs with: the prepared-data cache in the scratch dir, one thread.
inline std::string env(const TempDir& dir) { return "AXENGINE_CACHE_DIR=" + (dir / "cache") + " OMP_NUM_THREADS=1 "; }

// A tiny Llama (hidden 64, 2 layers, 4 heads of 16, 2 kv heads), the one-digit sums and a two-step LoRA run.
inline std::string good_config() {
  return "[run]\noutput_dir = \"out\"\nseed = 3\n"
         "[model]\npath = \"model\"\n"
         "[data]\nsequence_len = 64\n"
         "[[datasets]]\ntype = \"completion\"\npath = \"data/train.jsonl\"\neval_path = \"data/eval.jsonl\"\n"
         "prompt_field = \"prompt\"\ntext_field = \"answer\"\n"
         "[lora]\nr = 4\nalpha = 8\n"
         "[train]\nmax_steps = 2\nmicro_batch_size = 2\ncpu_threads = 1\n"
         "[eval]\nexact_match = false\n";
}

inline void make_run_dir(const TempDir& dir) {
  ax::test::make_tiny_llama(dir.path / "model");
  auto r = run(env(dir) + axengine() + " make-data --task arithmetic --digits 1 --train 80 --eval 20 --out " + (dir / "data"));
  REQUIRE(r.exit_code == 0);
  write_file(dir / "run.toml", good_config());
}

}  // namespace ax_test
