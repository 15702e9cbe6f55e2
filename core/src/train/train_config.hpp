// The [train], [optimizer], [checkpoint] and [eval] sections of the run config.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "axengine/config.hpp"

namespace ax::train {

struct TrainConfig {
  std::string optimizer = "adamw";
  double lr = 2e-4;
  std::string schedule = "cosine";
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
  double weight_decay = 0.0;
  int64_t micro_batch_size = 1;
  int64_t grad_accum = 1;
  double max_grad_norm = 1.0;
  int64_t num_epochs = 1;
  int64_t max_steps = 0;
  bool activation_checkpointing = false;
  // Layer inputs kept for backward go to host memory (models/offload.hpp); implies activation_checkpointing.
  bool activation_offload = false;
  // The MLP / MoE block of each layer in this many token shards, each recomputed in backward (models/tiled_mlp.hpp).
  int64_t tiled_mlp = 1;
  bool tiled_mlp_auto = false;  // tiled_mlp = "auto": plan_run sets tiled_mlp (choose_mlp_tiles, memory_estimate.hpp)
  int64_t log_every = 10;
  bool tensorboard = true;
  int64_t cpu_threads = 0;
  // Base parameters that train too (axolotl's unfrozen_parameters): patterns as models/unfrozen.hpp matches them.
  std::vector<std::string> unfrozen_parameters;
};

struct CheckpointConfig {
  int64_t every_steps = 0;
  double every_minutes = 30;  // 0 = off
  int64_t keep_last = 3;
  std::string resume_from;  // "" | "latest" | a checkpoint directory
};

struct EvalConfig {
  int64_t every_steps = 0;
  int64_t max_rows = 0;
  bool exact_match = true;
  int64_t max_samples = 256;
  int64_t max_new_tokens = 64;
  int64_t show_examples = 3;
};

// [profile]: Kineto trace + kernel summary of a few training steps (off unless steps > 0).
struct ProfileConfig {
  int64_t start_step = 5;  // steps before it (allocator and kernel warm-up) are not profiled
  int64_t steps = 0;
  int64_t top = 25;
};

TrainConfig read_train_config(const RunConfig& config);
CheckpointConfig read_checkpoint_config(const RunConfig& config);
EvalConfig read_eval_config(const RunConfig& config);
// An [eval] key that asks for evaluation (every_steps > 0, exact_match = true, max_rows, ...) while the data has no
// eval rows would be ignored: refused (exit 2) naming the key.
void check_eval_rows(const RunConfig& config, const EvalConfig& eval, std::size_t eval_samples);
ProfileConfig read_profile_config(const RunConfig& config);
// The [optimizer] table (empty when absent): options for the chosen optimizer provider.
const toml::table& optimizer_options(const RunConfig& config);

}  // namespace ax::train
