// What the training loop decides before its first step, as functions of the config and the data alone (no
// model): the packed rows and step counts, and the checkpoint a resume starts from, checked against them.
// The loop (trainer.cpp) and the run check (run_check.cpp, behind `axengine validate`) both call these, so
// validate refuses exactly what run would.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "data/packing.hpp"
#include "data/prepare.hpp"
#include "train/checkpoint.hpp"
#include "train/train_config.hpp"

namespace ax::train {

struct StepPlan {
  data::PackedRows train_rows, eval_rows;
  int64_t steps_per_epoch = 0, total_steps = 0;
};

// Packs the training rows from the seeded sample order (and the eval rows in file order) into rows of
// `sequence_len` tokens, and counts the steps. UsageError when the rows are fewer than one optimizer step takes
// (micro_batch_size x grad_accum x world: with data parallelism a step takes that many rows over all ranks).
StepPlan plan_steps(const data::PreparedData& data, int64_t sequence_len, const TrainConfig& train, uint64_t seed,
                    int64_t world = 1);

// The checkpoint to resume from ([checkpoint] resume_from: "" = none, "latest", or a directory), verified
// (manifest, trainer state, tensors). nullopt: start from step 0 ("latest" with no checkpoint yet). UsageError
// when the named one does not verify, or when every checkpoint "latest" finds fails to.
std::optional<LoadedCheckpoint> find_resume_checkpoint(const CheckpointConfig& checkpoint, const std::string& output_dir);

// The resume checks that need no model: the checkpoint must come from the same data, batch and seed
// (steps_per_epoch, seed), and not be past this run's last step. UsageError naming the checkpoint.
void check_resume_fits(const LoadedCheckpoint& checkpoint, int64_t steps_per_epoch, int64_t total_steps, int64_t seed);

}  // namespace ax::train
