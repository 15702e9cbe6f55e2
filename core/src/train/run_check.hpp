// The one check of a run before its first step: `axengine validate` calls it and prints what it found; `run`
// calls it first and trains from what it returns, so the two cannot disagree. It reads the config, the model's
// config.json / safetensors headers / tokenizer, the datasets (tokenised through the prepared-data cache) and
// a checkpoint to resume; it loads no weights and touches no GPU.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "axengine/engine.hpp"
#include "axengine/model.hpp"
#include "axengine/model_check.hpp"
#include "axengine/tokenizer.hpp"
#include "axengine/training.hpp"
#include "data/data_config.hpp"
#include "data/prepare.hpp"
#include "models/unfrozen.hpp"
#include "train/checkpoint.hpp"
#include "train/dist_config.hpp"
#include "train/lora_config.hpp"
#include "train/step_plan.hpp"
#include "train/train_config.hpp"

namespace ax::train {

struct RunPlan {
  std::unique_ptr<Tokenizer> tokenizer;
  data::DataConfig data_config;
  TrainConfig train;
  CheckpointConfig checkpoint;  // resume_from = "latest" under --resume
  EvalConfig eval;
  ProfileConfig profile;
  DistributedConfig distributed;
  DistEnv dist_env;             // torchrun's variables: the steps count the rows of all ranks
  LoraConfig lora;
  ModelLoadOptions model;       // what load_model gets (kernels included)
  ModelCheck model_check;
  models::UnfrozenPlan unfrozen;  // train.unfrozen_parameters resolved on the model (models/unfrozen.hpp)
  data::PreparedData data;
  StepPlan steps;
  std::optional<LoadedCheckpoint> resume;  // verified and fitting this run; none = from step 0
  std::vector<Resolution> backends;        // of the ops the model calls
  // The activations of one micro-batch (a lower bound) against the device's memory, for validate's report.
  std::optional<std::string> memory;
  // Why run cannot train on this machine (an arch override it does not match): run stops with it, validate
  // prints it as a note, since planning for another GPU is what the override is for.
  std::optional<std::string> device_problem;
};

// What load_model gets for this run's model: the config's model dir, the engine's dtype, device and kernels,
// the weight policy, and the LoRA spec (or the adapter lora.init_from continues).
ModelLoadOptions model_load_options(const Engine& engine, const LoraConfig& lora, const TrainConfig& train);
// check_model for the run's model, its errors prefixed with the run config's file.
ModelCheck check_run_model(const Engine& engine, const ModelLoadOptions& options);
// The resolution of every call in the model's plan (ModelCheck::ops and the quantizer), or of every op when the
// plan is unknown (a family without ModelFamilyCheck).
std::vector<Resolution> kernel_plan(const Engine& engine, const ModelCheck& model);

// Every check, in the order run meets them. Throws UsageError / ConfigError naming the file and key (exit 2).
RunPlan plan_run(const Engine& engine, const TrainOptions& options);

// The ranks the rows are cut over: the world, over context_parallel when a launcher started it (dist_context.hpp).
int64_t data_world(const RunPlan& plan);

// What validate prints about a plan: one line per part (model, data, steps, backends, resume, device).
std::vector<std::string> describe_plan(const Engine& engine, const RunPlan& plan);

// config.json's vocab_size, or 0 when unknown (data preparation then skips the id check).
int64_t model_vocab_size(const std::string& model_dir);

}  // namespace ax::train
