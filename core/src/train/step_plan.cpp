#include "train/step_plan.hpp"

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

StepPlan plan_steps(const data::PreparedData& data, int64_t sequence_len, const TrainConfig& train, uint64_t seed, int64_t world) {
  const int64_t S = sequence_len;
  StepPlan p;
  if (data.stream) {  // streamed: rows are packed as they are read; the run is max_steps long (stream_feed.hpp)
    std::vector<uint32_t> order(data.eval.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
    p.eval_rows = data::pack_samples(data.eval, order, S);
    p.steps_per_epoch = 1;  // no epochs: trainer_state's data cursor is the stream's (data_stream)
    p.total_steps = train.max_steps;
    return p;
  }
  // Rows are packed once, from a seeded sample order; every epoch then visits them in its own seeded order.
  p.train_rows = data::pack_samples(data.train, data::permutation(data.train.size(), data::mix_seed(seed, 1)), S);
  std::vector<uint32_t> eval_order(data.eval.size());
  for (std::size_t i = 0; i < eval_order.size(); ++i) eval_order[i] = static_cast<uint32_t>(i);
  p.eval_rows = data::pack_samples(data.eval, eval_order, S);
  const int64_t rows_per_step = train.micro_batch_size * train.grad_accum * world;
  p.steps_per_epoch = static_cast<int64_t>(p.train_rows.rows.size()) / rows_per_step;
  if (p.steps_per_epoch == 0)
    throw UsageError(ax::str("the training data packs into ", p.train_rows.rows.size(), " rows of ", S,
                             " tokens, fewer than one step needs (micro_batch_size ", train.micro_batch_size, " x grad_accum ",
                             train.grad_accum, world > 1 ? ax::str(" x ", world, " ranks") : std::string(), ")"));
  p.total_steps = train.max_steps > 0 ? train.max_steps : train.num_epochs * p.steps_per_epoch;
  return p;
}

std::optional<LoadedCheckpoint> find_resume_checkpoint(const CheckpointConfig& checkpoint, const std::string& output_dir) {
  const std::string& from = checkpoint.resume_from;
  if (from.empty()) return std::nullopt;
  if (from != "latest") return load_checkpoint(from);
  auto latest = load_latest_checkpoint(output_dir);
  for (const auto& [dir, why] : latest.skipped) log::warn(ax::str("resume: skipping checkpoint ", dir, ": ", why));
  if (!latest.loaded && !latest.skipped.empty())
    // Starting afresh would prune them and overwrite metrics.jsonl: the person decides, not the engine.
    throw UsageError(ax::str("resume: none of the ", latest.skipped.size(), " checkpoints in ", checkpoints_dir(output_dir),
                             " verifies (reasons above); move them away to start from step 0"));
  if (!latest.loaded) log::info(ax::str("resume: no checkpoint in ", checkpoints_dir(output_dir), " yet; starting from step 0"));
  return std::move(latest.loaded);
}

void check_resume_fits(const LoadedCheckpoint& ck, int64_t steps_per_epoch, int64_t total_steps, int64_t seed) {
  const TrainerState& st = ck.state;
  auto expect = [&](const char* key, int64_t got, int64_t want) {
    if (got != want)
      throw UsageError(ax::str(ck.dir, ": checkpoint has ", key, " = ", got, ", this run has ", want,
                               " (the data, batch size or seed changed; resume needs the same ones)"));
  };
  expect("steps_per_epoch", st.steps_per_epoch, steps_per_epoch);
  expect("seed", st.seed, seed);
  if (st.step > total_steps)
    throw UsageError(ax::str(ck.dir, ": checkpoint is at step ", st.step, ", past the ", total_steps,
                             " steps of this run (raise train.max_steps or num_epochs to continue it)"));
}

}  // namespace ax::train
