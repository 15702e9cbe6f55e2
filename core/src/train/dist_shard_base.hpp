// `[distributed] shard_base = true` (docs/distributed.md, "Sharding the frozen base"): every decoder layer's
// frozen tensors (norms, attention, MLP or experts, router, biases; dense or packed nf4/mxfp4/nvfp4 alike)
// are kept as 1/world of their bytes on each rank and all-gathered whole only while the layer runs: in
// forward, and again in backward where the layer is recomputed (models/layer_residency.hpp). The embeddings,
// the final norm and lm_head stay whole on every rank.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/config.hpp"
#include "axengine/model.hpp"
#include "axengine/registry.hpp"
#include "models/layer_residency.hpp"
#include "train/dist_config.hpp"
#include "train/dist_group.hpp"
#include "train/dist_shard.hpp"

namespace ax::train {

class ShardedBase final : public models::LayerResidency {
 public:
  // No layers yet: the model's load hands them over (take_layer). `group` is the gathers' own process
  // group: nothing else may use it (its collectives must come in one order on every rank, and the gradient
  // all-reduce starts from autograd hooks at times of its own).
  explicit ShardedBase(std::unique_ptr<DistGroup> group);
  ~ShardedBase() override;

  // Layer i's tensors (DecoderModel::layer_base_tensors, as the load completes the layer): laid out as one
  // flat byte buffer (each at a 64-byte aligned offset, so the gathered bytes view back as any dtype), of
  // which this rank keeps its chunk (ShardedTensors::add_pieces: the buffer itself is never built); the
  // slots are emptied. No collective.
  void take_layer(int64_t layer, const std::vector<at::Tensor*>& tensors) override;

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

// The model of `options` loaded with shard_base: its own process group over every rank (a sub group of
// `world` named "shard_base"), each layer cut to this rank's chunk as soon as the load holds it (so the
// load's peak is the rank's share plus about one layer, not the whole base), the model gathering the layers
// per use from then on. Collective: every rank calls it. A family other than core's decoder families reads
// nothing and fails with UsageError(refusal). Logs the resident bytes and the load's peak.
std::unique_ptr<Model> load_sharded_model(DistGroup& world, const Registry& registry, const ModelLoadOptions& options,
                                          const std::string& refusal);

// What a run with shard_base needs, checked before any weight is read (plan_run), each error at the key's
// file:line:col: not with expert_parallel > 1, not with eval.exact_match (generation runs on rank 0 alone).
void check_shard_base(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, bool exact_match);

}  // namespace ax::train
