// Checkpoints: <output_dir>/checkpoints/step-00000042/ holding
//   adapter_model.safetensors, adapter_config.json  the adapter in PEFT format (loadable by peft)
//   trainer_state.safetensors                        exact trainable parameters, optimizer state, RNG states
//   trainer_state.json                               step, data cursor, schedule, best eval, config (trainer_state.hpp)
//   manifest.json                                    every other file's size and CRC-32C (checkpoint_manifest.hpp)
// A checkpoint is built in a hidden .tmp- directory and renamed into place (atomic_dir.hpp): a directory
// named step-* was complete when written, whenever the process died. Older checkpoints are deleted (renamed to
// .trash- first, so none is ever seen half-deleted) only after a newer one is in place. Crash points:
// checkpoint.file_* and checkpoint.dir_* (the files and the directory), adapter.file_* (the adapter's files),
// checkpoint.prune_renamed and checkpoint.prune_removed.
//
// Loading verifies before it trusts: the manifest (sizes, checksums), every field of trainer_state.json, and the
// tensors file; resume from "latest" walks the checkpoints newest first and takes the newest that verifies.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/trainer_state.hpp"

namespace ax::train {

struct CheckpointPayload {
  std::vector<std::pair<std::string, at::Tensor>> params;  // trainable parameters by name
  std::map<std::string, at::Tensor> optimizer;
  std::map<std::string, at::Tensor> rng;                   // "cpu", "cuda"
  TrainerState state;
  std::function<void(const std::string& dir)> write_adapter;
};

struct LoadedCheckpoint {
  std::string dir;
  TrainerState state;
  std::map<std::string, at::Tensor> params, optimizer, rng;
  bool has_manifest = false;  // false: written before manifests, checked structurally only
};

std::string checkpoints_dir(const std::string& output_dir);
// Writes the checkpoint of `step` (replacing one of the same step), then deletes all but the newest
// `keep_last`. Returns its directory.
std::string save_checkpoint(const std::string& output_dir, int64_t step, const CheckpointPayload& payload, int64_t keep_last);

// Verifies and loads one checkpoint: manifest.json (every file's size and CRC-32C), trainer_state.json (every
// field; the step must match the directory's name step-N), trainer_state.safetensors. A directory without a
// manifest (written before manifests) is accepted after the same structural checks, with a warning. Throws
// UsageError naming the file at fault.
LoadedCheckpoint load_checkpoint(const std::string& dir);

struct LatestCheckpoint {
  std::optional<LoadedCheckpoint> loaded;                    // the newest that verifies, if any
  std::vector<std::pair<std::string, std::string>> skipped;  // newer ones that did not: (dir, why)
};
// Walks <output_dir>/checkpoints/step-* newest first and loads the first that verifies.
LatestCheckpoint load_latest_checkpoint(const std::string& output_dir);
// The directory load_latest_checkpoint picks, "" when none verifies.
std::string find_latest_checkpoint(const std::string& output_dir);

}  // namespace ax::train
