// The main job behind `axengine run` and `axengine prepare`: datasets -> packed rows -> LoRA training with
// checkpoints, eval, metrics.jsonl and report.html in [run].output_dir. The CLI stays thin; this is the API.
#pragma once
#include <cstdint>
#include <string>

namespace ax {

class Engine;

struct TrainOptions {
  bool resume = false;  // --resume: same as [checkpoint] resume_from = "latest"
};

// Prints the kernel resolution table, prepares data, loads the model (+ LoRA), trains, prints the summary.
void train_from_config(Engine& engine, const TrainOptions& options);

// Tokenises every [[datasets]] entry into the prepared-data cache (what `run` would reuse) and reports it.
void prepare_from_config(Engine& engine);

// The quickstart's self-made data: sums "a+b=" -> "c", written as <out_dir>/train.jsonl and eval.jsonl
// completion rows {"prompt": "12+35=", "answer": "47"}; eval sums never occur in train.
struct ArithmeticOptions {
  int64_t train_rows = 4000;
  int64_t eval_rows = 200;
  int64_t digits = 2;
  uint64_t seed = 1;
};
void write_arithmetic_task(const std::string& out_dir, const ArithmeticOptions& options);

}  // namespace ax
