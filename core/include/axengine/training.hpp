// The main job behind `axengine run` and `axengine prepare`: datasets -> packed rows -> LoRA training with
// checkpoints, eval, metrics.jsonl and report.html in [run].output_dir. The CLI stays thin; this is the API.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ax {

class Engine;

struct TrainOptions {
  bool resume = false;  // --resume: same as [checkpoint] resume_from = "latest"
  // --overwrite: start afresh in a non-empty output_dir, removing the previous run's outputs (checkpoints/,
  // metrics.jsonl, report.html, profile/) first. Without it such a start is refused: two runs would mix.
  bool overwrite = false;
};

// What a run writes into output_dir, relative to it: what --overwrite removes.
std::vector<std::string> run_output_names();

// Runs check_run's checks, prints the kernel resolution table of the model's calls, loads the model (+ LoRA),
// trains, prints the summary.
void train_from_config(Engine& engine, const TrainOptions& options);

// `axengine validate`: everything `run` checks before its first step — it is the same function run calls first —
// without loading weights or touching a GPU: model and data paths, dataset types, LoRA targets against the
// model's modules, batch against the packed data, backends for the model's ops (kernels.strict), the [kernels]
// names, the checkpoint to resume. Throws UsageError / ConfigError naming the file and key (exit 2). Returns the
// lines validate prints: what would run, and a note when run would stop on this machine (an arch override).
std::vector<std::string> check_run(const Engine& engine, const TrainOptions& options);

// `axengine plugins explain`: the kernel resolution table of every call the config's model makes (the plan
// `validate` and kernels.strict check: op, weight format, layout), or of every op when the config names no model.
// Throws UsageError for a model the run would refuse (its file and key named).
std::string explain_kernels(const Engine& engine);

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
