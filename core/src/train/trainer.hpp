// The training loop over an already-built model and prepared data. run.cpp builds those from an Engine;
// tests build them directly (small models, fake tokenizers).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/device.hpp"
#include "axengine/model.hpp"
#include "axengine/registry.hpp"
#include "data/data_config.hpp"
#include "data/prepare.hpp"
#include "train/checkpoint.hpp"
#include "train/dist_group.hpp"
#include "train/loss_scaler.hpp"
#include "train/train_config.hpp"

namespace ax::train {

struct TrainerSetup {
  const RunConfig* config = nullptr;  // seed, output_dir, [optimizer]
  const Registry* registry = nullptr; // optimizer providers
  DeviceInfo device;
  Model* model = nullptr;
  std::shared_ptr<KernelSet> kernels;  // the model's kernel set, if known: the step executor checks its backends
  int32_t pad_id = 0, eos_id = -1;
  data::PreparedData data;
  data::DataConfig data_config;
  TrainConfig train;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  ProfileConfig profile;
  std::function<void(const std::string& dir)> write_adapter;  // PEFT adapter files into `dir`
  std::function<std::string(const std::vector<int32_t>&)> decode;  // for eval examples; may be empty
  // The checkpoint to resume from. Empty: the loop calls find_resume_checkpoint (step_plan.hpp) itself; run
  // hands over the one its check already verified, so a large optimizer state is not read twice.
  std::function<std::optional<LoadedCheckpoint>()> resume_checkpoint;
  std::string title = "axengine run";
  // Data parallelism (docs/distributed.md): null = this process alone. Each rank trains its own rows of every
  // step, the gradients are averaged over the ranks, and only rank 0 writes (metrics, report, checkpoints).
  DistGroup* group = nullptr;
  double bucket_mb = 25;  // [distributed] bucket_mb
  // Expert parallelism ([distributed] expert_parallel, train/dist_expert.hpp): null without it. The expert
  // LoRA parameters (is_expert_parameter) are this rank's shard: their gradients are summed over
  // `expert_replicas` (the ranks holding the same experts) and divided by the world, their squares enter the
  // norm over `expert_group`; every rank runs the forward of an evaluation (its all-to-alls need the whole
  // group), and `gather_adapter` (collective) assembles the full adapter before rank 0 writes a checkpoint.
  DistGroup* expert_group = nullptr;
  DistGroup* expert_replicas = nullptr;
  std::function<void()> gather_adapter;
  // Context parallelism ([distributed] context_parallel, train/dist_context.hpp): groups of this many consecutive
  // ranks train the same micro-batches (the model splits their rows), so the data is cut over world / N ranks;
  // each rank's loss value is its micro-batch's, its gradient its share's.
  int64_t context_parallel = 1;
  // shard_base (train/dist_shard_base.hpp): a forward needs every rank (each gathers the layers' shards), so
  // every rank runs the forward passes of an evaluation, as under expert parallelism.
  bool every_rank_evaluates = false;
  // fp16 (run.cpp sets it when the compute dtype is fp16): dynamic loss scaling (train/loss_scaler.hpp). The
  // trainable parameters must be fp32 (master weights).
  std::optional<LossScaleOptions> loss_scaling;
};

struct TrainSummary {
  int64_t first_step = 0, steps = 0;   // steps run by this process, and the final step
  double wall_s = 0, tokens_per_s = 0;
  int64_t tokens = 0;
  double peak_memory_bytes = 0;
  double final_loss = NAN, final_eval_loss = NAN, best_eval_loss = NAN, exact_match = NAN;
  std::vector<double> losses;          // per optimizer step run by this process
  std::string last_checkpoint;
};

TrainSummary run_trainer(TrainerSetup& setup);

// Parameters that must not get weight decay: norms, biases, anything 1-D.
bool exempt_from_weight_decay(const std::string& name, const at::Tensor& t);

}  // namespace ax::train
