#include "models/tiled_mlp.hpp"

#include <atomic>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant.hpp"
#include "models/recompute.hpp"

namespace ax::models {
namespace {

std::atomic<int64_t> g_mlp_tiles{1};
std::atomic<int64_t> g_shard_calls{0};
std::atomic<int64_t> g_dequant_calls{0};
thread_local ExpertWeightCache* t_cache = nullptr;

}  // namespace

void set_mlp_tiles(int64_t n) { g_mlp_tiles = n < 1 ? 1 : n; }
int64_t mlp_tiles() { return g_mlp_tiles; }
int64_t tiled_mlp_shard_calls() { return g_shard_calls; }
int64_t expert_dequant_calls() { return g_dequant_calls; }

int64_t mlp_shard_count(int64_t tokens) {
  const int64_t n = mlp_tiles();
  if (n <= 1 || tokens < 2) return 1;
  const int64_t per = (tokens + n - 1) / n;  // at::chunk's shard size
  return (tokens + per - 1) / per;
}

ops::WeightTensor ExpertWeightCache::get(const std::string& name, const ops::WeightTensor& packed, at::ScalarType dtype) {
  Entry& e = entries_[name];
  if (!e.dense.values.defined()) {
    e.dense = ops::WeightTensor::dense(ops::dequantize(packed, dtype));
    ++g_dequant_calls;
  }
  ops::WeightTensor out = e.dense;
  if (++e.uses == shards_) e = Entry{};  // the pass's last shard: the next pass decodes again
  return out;
}

ExpertWeightCache* current_expert_cache() { return t_cache; }
ExpertCacheScope::ExpertCacheScope(ExpertWeightCache* c) : previous_(t_cache) { t_cache = c; }
ExpertCacheScope::~ExpertCacheScope() { t_cache = previous_; }

at::Tensor tiled_mlp(const MlpBlock& block, const at::Tensor& x, std::vector<at::Tensor>& router_logits) {
  const int64_t n = mlp_tiles();
  if (n <= 1 || x.size(0) < 2) return block(x, router_logits);
  // Autograd records (training, or a layer's recomputation in backward): each shard is a recompute node, so
  // only its input is kept. Otherwise (a checkpointed layer's first forward, eval) the shards just run in turn.
  const bool record = at::GradMode::is_enabled();
  std::vector<at::Tensor> ys, logits;
  for (const at::Tensor& shard : x.chunk(n, 0)) {
    std::vector<at::Tensor> outs;
    if (record) {
      outs = autograd::recompute(
          [block](const at::Tensor& t) {
            ++g_shard_calls;
            std::vector<at::Tensor> r;
            at::Tensor y = block(t, r);
            r.insert(r.begin(), y);
            return r;
          },
          shard, /*offloadable=*/false);
    } else {
      ++g_shard_calls;
      at::Tensor y = block(shard, outs);
      outs.insert(outs.begin(), y);
    }
    if (outs.size() > 2) throw RuntimeError("tiled_mlp: an MLP block gave more than one router logits tensor");
    ys.push_back(outs[0]);
    if (outs.size() == 2) logits.push_back(outs[1]);
  }
  if (!logits.empty()) router_logits.push_back(at::cat(logits, 0));
  return at::cat(ys, 0);
}

}  // namespace ax::models
