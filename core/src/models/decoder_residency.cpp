// DecoderModel's side of shard_base (models/layer_residency.hpp): which tensors belong to a layer, and
// handing them to an owner that keeps them elsewhere between the layer's uses.
#include <map>
#include <set>
#include <utility>

#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/storage_set.hpp"

namespace ax::models {

std::vector<at::Tensor*> DecoderModel::layer_base_tensors(int64_t i) {
  const std::string prefix = str("model.layers.", i, ".");
  auto in_layer = [&](const std::string& name) { return name.compare(0, prefix.size(), prefix) == 0; };
  std::vector<at::Tensor*> out;
  // std::map: the names in one order on every rank, and stable addresses for the slots.
  for (auto& [name, t] : weights_)
    if (in_layer(name) && t.defined()) out.push_back(&t);
  for (auto& [name, wt] : frozen_)
    if (in_layer(name))
      for (at::Tensor* t : {&wt.values, &wt.codes, &wt.scales, &wt.nested_scales, &wt.nested_code, &wt.global_scale})
        if (t->defined()) out.push_back(t);
  return out;
}

DecoderModel::HandOver DecoderModel::hand_over_layer(int64_t i, LayerResidency& owner, StorageSet& whole) {
  const std::vector<at::Tensor*> slots = layer_base_tensors(i);
  HandOver h;
  // Each storage once (the nf4 double-quant code is shared by the layer's weights, and by every layer).
  std::map<const void*, std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, int64_t>> storages;
  for (const at::Tensor* t : slots) {
    const auto nbytes = static_cast<int64_t>(t->storage().nbytes());
    if (whole.insert(*t)) h.whole += nbytes;
    storages.try_emplace(t->storage().data(), t->storage().getWeakStorageImpl(), nbytes);
  }
  const int64_t before = owner.resident_bytes();
  owner.take_layer(i, slots);
  h.kept = owner.resident_bytes() - before;
  // Freed: what nothing references any more (not the double-quant code, which the quantizer keeps).
  for (const auto& [data, s] : storages)
    if (s.first.expired()) h.freed += s.second;
  return h;
}

void DecoderModel::set_layer_residency(std::shared_ptr<LayerResidency> residency) {
  residency_ = std::move(residency);
  // Without recompute autograd would keep every layer's gathered tensors from forward until backward: the
  // whole base again. With it, backward runs the layer once more, between its own acquire and release.
  recompute_layers_ = true;
  // The resident bytes: what is still held here (embeddings, final norm, lm_head) plus the owner's share.
  std::set<const void*> seen;
  int64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().data()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const auto& [n, t] : weights_) count(t);
  for (const auto& [n, wt] : frozen_)
    for (const at::Tensor* t : {&wt.values, &wt.codes, &wt.scales, &wt.nested_scales, &wt.nested_code, &wt.global_scale}) count(*t);
  stats_.bytes = bytes + (residency_ ? residency_->resident_bytes() : 0);
}

}  // namespace ax::models
