#include "train/dist_shard_base.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <utility>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/register.hpp"

namespace ax::train {
namespace {

// Every tensor of a layer starts at a multiple of this in the flat buffer: a byte view of the gathered
// buffer then reinterprets as any dtype (view(dtype) needs the offset to be a multiple of the element size),
// and a kernel gets the alignment a fresh allocation would have had for vector loads.
constexpr int64_t kAlign = 64;

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

ShardedBase::ShardedBase(std::unique_ptr<DistGroup> group) : group_(std::move(group)) {
  shards_ = std::make_unique<ShardedTensors>(*group_, std::vector<at::Tensor>{});
}

void ShardedBase::take_layer(int64_t layer, const std::vector<at::Tensor*>& tensors) {
  if (layer != static_cast<int64_t>(layers_.size()))
    throw RuntimeError(str("shard_base: layer ", layer, " handed over after ", layers_.size(), " layers (they come in order)"));
  at::NoGradGuard no_grad;
  std::vector<Slot> slots;
  std::vector<ShardedTensors::Piece> pieces;  // the bytes to place (a tensor several weights share: once)
  std::map<std::pair<const void*, int64_t>, int64_t> placed;  // a contiguous tensor's (data, bytes) -> offset
  int64_t total = 0;
  at::Device device = at::kCPU;
  for (at::Tensor* t : tensors) {
    const int64_t bytes = t->numel() * static_cast<int64_t>(t->element_size());
    // nf4's double-quant code is one tensor shared by every packed weight: stored (and gathered) once.
    if (t->is_contiguous()) {
      auto found = placed.find({t->data_ptr(), bytes});
      if (found != placed.end()) {
        slots.push_back({t, found->second, bytes, t->sizes().vec(), t->scalar_type()});
        continue;
      }
      placed[{t->data_ptr(), bytes}] = total;
    }
    slots.push_back({t, total, bytes, t->sizes().vec(), t->scalar_type()});
    if (bytes) pieces.push_back({*t, total});
    total = aligned(total + bytes);
    device = t->device();
  }
  // The layer's flat buffer (zero between the pieces and in the padding) is never built: only this rank's
  // chunk of it is, so cutting a layer while loading costs its chunk, not a second copy of the layer.
  shards_->add_pieces(total, pieces);
  pieces.clear();
  for (const Slot& s : slots) *s.slot = at::Tensor();  // the full tensors go (the chunk is a copy of its own)
  layers_.push_back(std::move(slots));
  devices_.push_back(device);
}

ShardedBase::~ShardedBase() {
  // What the prefetch achieved: every layer but the first of each pass should have been gathered ahead.
  log::info(str("shard_base: ", prefetched_, " layer gathers prefetched, ", on_demand_, " on demand"));
}

void ShardedBase::acquire(int64_t layer) {
  const bool recomputing = at::GradMode::is_enabled();  // before the guard below: see the prefetch
  at::NoGradGuard no_grad;
  const auto i = static_cast<std::size_t>(layer);
  if (layer < 0 || i >= layers_.size()) throw RuntimeError(str("shard_base: no layer ", layer));
  at::Tensor flat;
  if (next_ && next_->index() == i) {
    flat = next_->wait();
    ++prefetched_;
  } else {
    // A prefetch for another layer (a guess that missed: a forward with autograd on, outside training) is
    // finished and dropped: every rank started it, so every rank waits for it.
    if (next_) next_->wait();
    flat = shards_->gather(i);
    ++on_demand_;
  }
  next_.reset();
  if (flat.device() != devices_[i]) flat = flat.to(devices_[i]);  // gloo with the model on a GPU
  for (const Slot& s : layers_[i]) *s.slot = flat.narrow(0, s.offset, s.bytes).view(s.dtype).view(s.shape);
  // The next layer of this pass: i + 1 in a forward, i - 1 in backward, where the layer is recomputed with
  // autograd on (recompute.cpp; a forward under shard_base runs with autograd off: inside the recompute node,
  // or under an evaluation's no_grad). The last layer of a pass starts nothing, so no gather is in flight
  // between passes, and the first layer of a pass is gathered on the spot. Every rank runs the same passes,
  // so every rank starts the same gathers; a wrong guess would only cost a gather (waited for and dropped).
  const int64_t L = static_cast<int64_t>(layers_.size());
  const int64_t dir = recomputing ? -1 : 1;
  const int64_t n = layer + dir;
  if (n >= 0 && n < L) next_ = shards_->gather_async(static_cast<std::size_t>(n));
}

void ShardedBase::release(int64_t layer) noexcept {
  const auto i = static_cast<std::size_t>(layer);
  if (layer < 0 || i >= layers_.size()) return;
  // The slots let go; what autograd saved of the layer (its recomputation in backward) holds the gathered
  // buffer until that backward is done, then the allocator takes it back.
  for (const Slot& s : layers_[i]) *s.slot = at::Tensor();
}

std::unique_ptr<Model> load_sharded_model(DistGroup& world, const Registry& registry, const ModelLoadOptions& options,
                                          const std::string& refusal) {
  std::vector<int64_t> all;
  for (int64_t r = 0; r < world.world(); ++r) all.push_back(r);
  auto sb = std::make_shared<ShardedBase>(world.subgroup(all, "shard_base"));
  std::unique_ptr<Model> model = models::load_model(registry, options, sb);
  if (!model) throw UsageError(refusal);
  auto& decoder = dynamic_cast<models::DecoderModel&>(*model);
  const WeightStats ws = model->weight_stats();
  log::info(str("shard_base: the ", decoder.config().num_layers, " layers' frozen tensors sharded over ", world.world(),
                " ranks: ", ws.bytes, " base bytes resident on this rank (", decoder.whole_base_bytes(), " whole), of which ",
                sb->resident_bytes(), " are its share of the layers; peak ", ws.peak_bytes, " while loading (each layer "
                "cut to this rank's share as soon as it was read); each layer is gathered in forward and again in "
                "backward, where it is recomputed"));
  return model;
}

void check_shard_base(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, bool exact_match) {
  if (!d.shard_base || !env.launched) return;
  auto fail = [&](const std::string& why) { config_fail(config.file, d.shard_base_at, str("'distributed.shard_base' = true: ", why)); };
  if (d.expert_parallel > 1)
    fail(str("not together with expert_parallel = ", d.expert_parallel,
             " (the expert layers would need gathers inside an expert-parallel group; choose one)"));
  if (exact_match)
    fail("eval.exact_match generates on rank 0 alone, which cannot gather the other ranks' shards; set it to false");
}

}  // namespace ax::train
