// Where a decoder layer's frozen tensors are while the layer is not running ([distributed] shard_base,
// docs/distributed.md "Sharding the frozen base"). DecoderModel::layer() calls acquire(i) before it reads
// any of layer i's tensors and release(i) when it returns (also when it throws): the owner fills the
// layer's slots (DecoderModel::layer_base_tensors) in acquire and empties them in release. The model sees
// only this interface, so model code needs no c10d header (train/dist_shard_base.cpp implements it).
//
// With recompute on (which a residency turns on), a layer runs once in forward with autograd off and once
// more in backward: acquire/release bracket both, so nothing of the layer stays resident in between.
//
// The owner gets the layers while the model loads (DecoderModel's constructor): take_layer(i) as soon as
// the load holds all of layer i's tensors (quantised or read packed), so that no more than one layer is
// ever whole in memory and the load's peak is the owner's share plus about one layer, not the whole base.
#pragma once
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax::models {

class LayerResidency {
 public:
  virtual ~LayerResidency() = default;
  // Layer i's tensors, whole, from the load: called once per layer, in layer order, with the slots of
  // DecoderModel::layer_base_tensors(i). Keeps what it keeps of them (a copy) and empties the slots. No
  // collective (every rank reads the whole layer from the checkpoint).
  virtual void take_layer(int64_t layer, const std::vector<at::Tensor*>& slots) = 0;
  // Layer i's tensors into their slots; may be a collective (every rank calls it for the same layers in
  // the same order: the model's layer order in forward, the reverse in backward).
  virtual void acquire(int64_t layer) = 0;
  // Empties the slots again (no collective; must not throw: it runs while unwinding).
  virtual void release(int64_t layer) noexcept = 0;
  // The bytes of the layers' tensors this process keeps between acquires (for WeightStats::bytes).
  virtual int64_t resident_bytes() const = 0;
};

}  // namespace ax::models

namespace ax::models {

// acquire on construction, release on destruction (a layer that throws still lets go of its tensors).
class ResidentLayer {
 public:
  ResidentLayer(LayerResidency* r, int64_t layer) : r_(r), layer_(layer) {
    if (r_) r_->acquire(layer_);
  }
  ~ResidentLayer() {
    if (r_) r_->release(layer_);
  }
  ResidentLayer(const ResidentLayer&) = delete;
  ResidentLayer& operator=(const ResidentLayer&) = delete;

 private:
  LayerResidency* r_;
  int64_t layer_;
};

}  // namespace ax::models
