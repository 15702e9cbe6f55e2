// Checkpoints: <output_dir>/checkpoints/step-00000042/ holding
//   adapter_model.safetensors, adapter_config.json  the adapter in PEFT format (loadable by peft)
//   trainer_state.safetensors                        exact trainable parameters, optimizer state, RNG states
//   trainer_state.json                               step, data cursor, schedule, best eval, config digest
// A checkpoint is built in a hidden .tmp- directory (every file fsynced), which is fsynced and then renamed
// into place, and the parent directory fsynced: a directory named step-* is always complete, whenever the
// process dies. Older checkpoints are deleted only after a newer one is in place.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace ax::train {

struct CheckpointPayload {
  std::vector<std::pair<std::string, at::Tensor>> params;  // trainable parameters by name
  std::map<std::string, at::Tensor> optimizer;
  std::map<std::string, at::Tensor> rng;                   // "cpu", "cuda"
  nlohmann::json state;                                    // must hold "step"
  std::function<void(const std::string& dir)> write_adapter;
};

struct LoadedCheckpoint {
  std::string dir;
  nlohmann::json state;
  std::map<std::string, at::Tensor> params, optimizer, rng;
};

std::string checkpoints_dir(const std::string& output_dir);
// Writes the checkpoint of `step`, then deletes all but the newest `keep_last`. Returns its directory.
std::string save_checkpoint(const std::string& output_dir, int64_t step, const CheckpointPayload& payload, int64_t keep_last);
// The newest complete checkpoint under output_dir, "" when there is none.
std::string find_latest_checkpoint(const std::string& output_dir);
// Throws UsageError naming the directory and the file at fault.
LoadedCheckpoint load_checkpoint(const std::string& dir);

// rm -rf, errors ignored (the caller checks what matters).
void remove_tree(const std::string& path);
void fsync_dir(const std::string& path);

}  // namespace ax::train
