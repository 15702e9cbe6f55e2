// The trainer on TinyLM (train_fakes.hpp) from a run.toml, for the trainer and resume tests: a run directory
// of 24 one-digit sums and the setup run_trainer needs.
#pragma once
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/registry.hpp"
#include "data/register.hpp"
#include "train/optimizers.hpp"
#include "train/trainer.hpp"
#include "unit/test_paths.hpp"
#include "unit/train_fakes.hpp"

namespace ax::test {

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// 24 sums "a+b=" -> "c" (3 eval), rows of 32 tokens: 6 steps per epoch at batch 1; 12 steps, eval every 6,
// a checkpoint every 4 (all kept). `extra` is appended to run.toml.
inline std::filesystem::path make_run_dir(const std::string& name, const std::string& extra) {
  auto dir = scratch_dir(name);
  std::string rows;
  for (int i = 0; i < 24; ++i) {
    int a = (i * 7) % 10, b = (i * 3 + 1) % 10;
    rows += "{\"prompt\": \"" + std::to_string(a) + "+" + std::to_string(b) + "=\", \"text\": \"" + std::to_string(a + b) + "\"}\n";
  }
  write_text(dir / "sums.jsonl", rows);
  write_text(dir / "run.toml", "[run]\noutput_dir = \"out\"\nseed = 3\n"
                               "[data]\nsequence_len = 32\neval_fraction = 0.125\ncache = false\n"
                               "[[datasets]]\ntype = \"completion\"\npath = \"sums.jsonl\"\nprompt_field = \"prompt\"\n"
                               "[train]\nlr = 0.01\nschedule = \"cosine\"\nwarmup_steps = 2\nmax_steps = 12\nweight_decay = 0.01\n"
                               "[eval]\nevery_steps = 6\n[checkpoint]\nevery_steps = 4\nkeep_last = 10\n" + extra);
  return dir;
}

struct Harness {
  ByteTokenizer tok;
  TinyLM model;
  Registry reg;
  RunConfig cfg;
  train::TrainerSetup setup;

  // `add_types` registers more dataset types (test ones) before the data is prepared.
  Harness(const std::filesystem::path& dir, std::vector<std::string> sets = {},
          const std::function<void(Registry&)>& add_types = {}) {
    data::register_builtin_datasets(reg);
    if (add_types) add_types(reg);
    train::register_builtin_optimizers(reg);
    cfg = load_config((dir / "run.toml").string(), sets);
    setup.config = &cfg;
    setup.registry = &reg;
    setup.model = &model;
    setup.pad_id = 257;
    setup.eos_id = 256;
    setup.data_config = data::read_data_config(cfg);
    setup.data = data::prepare_datasets(cfg, setup.data_config, reg, tok);
    setup.train = train::read_train_config(cfg);
    setup.checkpoint = train::read_checkpoint_config(cfg);
    setup.eval = train::read_eval_config(cfg);
    setup.write_adapter = [this](const std::string& d) { model.save_adapter(d); };
    setup.decode = [this](const std::vector<int32_t>& ids) { return tok.decode(ids, false); };
  }
  train::TrainSummary run() { return train::run_trainer(setup); }
};

}  // namespace ax::test
