// trainer_state.json, the part of a checkpoint people can read: where the run stands and what it was.
// Every field is typed and range-checked on load, so a damaged or hand-edited file is refused with its name
// and the field's, instead of resuming "at step -5".
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ax::train {

// fp16 runs' dynamic loss scale (train/loss_scaler.hpp), as torch.amp.GradScaler.state_dict() holds it: the scale (a
// float32 value) and the finite steps in a row since it last changed.
struct LossScaleState {
  float scale = 0;
  int32_t growth_tracker = 0;
};

struct TrainerState {
  int64_t step = 0;             // optimizer steps done, in [1, total_steps]
  int64_t epoch = 0;            // step / steps_per_epoch
  int64_t step_in_epoch = 0;    // step % steps_per_epoch: the data cursor
  int64_t steps_per_epoch = 0;  // >= 1
  int64_t total_steps = 0;      // of the run that wrote it, >= 1
  int64_t seed = 0;             // run.seed
  double lr_next = 0;           // the learning rate of the next step: finite, >= 0
  std::optional<double> best_eval_loss;  // finite, or none yet (null)
  std::string config;           // the config file of the run that wrote it
  // Token accounting over every step up to `step` (all processes of the run): the tokens fed to the model,
  // and those with a loss target (labels != -100, not a sample's first token). Absent in checkpoints written
  // before the fields existed: none, and the resumed run says its counts start there.
  std::optional<int64_t> tokens_seen, trainable_tokens_seen;
  // A streamed run's data position ({"cursor": StreamCursor, "sequence_len", "rows_per_step"}): where the next
  // step's rows start. Absent for map-style runs, whose cursor is the step.
  std::optional<nlohmann::json> data_stream;
  // An fp16 run's loss scaler ({"scale", "growth_tracker"}); absent in other runs.
  std::optional<LossScaleState> loss_scale;

  nlohmann::json to_json() const;
};

// Parses and checks every field (types, ranges, epoch and step_in_epoch against steps_per_epoch, no unknown
// fields); `dir_step`, when the checkpoint's directory is named step-N, must equal `step`. Throws UsageError
// naming `file` and the field.
TrainerState parse_trainer_state(const nlohmann::json& j, const std::string& file, std::optional<int64_t> dir_step);

}  // namespace ax::train
