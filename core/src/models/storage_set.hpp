// Tensor storages counted once each, for the load's byte counts (DecoderModel's WeightStats). A storage is
// known by its address for as long as it lives: once freed (shard_base hands each layer over while the
// model loads, models/layer_residency.hpp) its address may come back for a new tensor, which then counts
// as new. A plain set of addresses would count that tensor as already seen.
#pragma once
#include <map>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

namespace ax::models {

class StorageSet {
 public:
  // True when t's storage was not counted yet (or only a freed one at its address): add its bytes.
  bool insert(const at::Tensor& t) {
    auto weak = t.storage().getWeakStorageImpl();
    auto [it, fresh] = seen_.try_emplace(t.storage().data(), weak);
    if (fresh) return true;
    if (!it->second.expired()) return false;
    it->second = std::move(weak);
    return true;
  }

 private:
  std::map<const void*, c10::weak_intrusive_ptr<c10::StorageImpl>> seen_;
};

}  // namespace ax::models
