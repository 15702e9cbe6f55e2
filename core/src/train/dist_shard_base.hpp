// `[distributed] shard_base = true` (docs/distributed.md, "Sharding the frozen base"): every decoder layer's
// frozen tensors (norms, attention, MLP or experts, router, biases; dense or packed nf4/mxfp4/nvfp4 alike)
// are kept as 1/world of their bytes on each rank and all-gathered whole only while the layer runs: in
// forward, and again in backward where the layer is recomputed (models/layer_residency.hpp). The embeddings,
// the final norm and lm_head stay whole on every rank.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/config.hpp"
#include "models/layer_residency.hpp"
#include "train/dist_config.hpp"
#include "train/dist_group.hpp"
#include "train/dist_shard.hpp"

namespace ax::models {
class DecoderModel;
}

namespace ax::train {

class ShardedBase final : public models::LayerResidency {
 public:
  // Takes every layer's tensors out of `model` (DecoderModel::layer_base_tensors), one layer at a time: its
  // tensors are packed into one flat byte buffer (each at a 64-byte aligned offset, so the gathered bytes
  // view back as any dtype), this rank keeps its chunk (ShardedTensors), the slots are emptied. `group` is
  // the gathers' own process group: nothing else may use it (its collectives must come in one order on every
  // rank, and the gradient all-reduce starts from autograd hooks at times of its own).
  ShardedBase(std::unique_ptr<DistGroup> group, models::DecoderModel& model, int64_t num_layers);
  ~ShardedBase() override;

  // Layer i's tensors back into their slots: the prefetched gather when it is layer i's, else a gather
  // now. Then the next layer's gather is started (prefetch): i + 1 in a forward, i - 1 in backward's
  // recomputation (autograd on); the last layer of a pass starts nothing, so no gather is in flight between
  // passes.
  void acquire(int64_t layer) override;
  void release(int64_t layer) noexcept override;
  int64_t resident_bytes() const override { return shards_->resident_bytes(); }

  // Gathers started ahead of their layer and used by it, and gathers made on the spot (tests, logs).
  int64_t prefetched() const { return prefetched_; }
  int64_t on_demand() const { return on_demand_; }

 private:
  struct Slot {
    at::Tensor* slot;
    int64_t offset, bytes;
    std::vector<int64_t> shape;
    at::ScalarType dtype;
  };
  std::unique_ptr<DistGroup> group_;
  std::unique_ptr<ShardedTensors> shards_;  // tensor i: layer i's flat bytes
  std::vector<std::vector<Slot>> layers_;
  std::vector<at::Device> devices_;  // where each layer's tensors lived (the model's device)
  std::optional<ShardedTensors::Pending> next_;
  int64_t prefetched_ = 0, on_demand_ = 0;
};

// shard_base for a loaded model: its own process group over every rank (a sub group of `world` named
// "shard_base"), the layers' tensors sharded, the model gathering them per layer from now on. Collective:
// every rank calls it. Logs the resident bytes.
std::shared_ptr<ShardedBase> shard_model_base(DistGroup& world, models::DecoderModel& model);

// What a run with shard_base needs, checked before any weight is read (plan_run), each error at the key's
// file:line:col: not with expert_parallel > 1, not with eval.exact_match (generation runs on rank 0 alone).
void check_shard_base(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, bool exact_match);

}  // namespace ax::train
