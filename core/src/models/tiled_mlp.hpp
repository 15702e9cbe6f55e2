// Tiled MLP ([train] tiled_mlp = N, docs/training.md "Long context"): the MLP / MoE block of each decoder layer
// runs over its tokens in N row shards, each shard under recompute (models/recompute.hpp) when autograd records,
// so the block's intermediates (gate, up, their product; MoE: the routed rows, each expert's hidden rows) exist
// for one shard at a time, in forward and in backward. The block's math is per token (norms before it, the
// residual after it), so the output rows are those of the untiled block; the router logits of a MoE block are the
// shards' concatenated in token order, so the aux loss sees every token as before. The LoRA gradients are sums
// over the shards, in another order than one GEMM over all tokens: equal to within fp32 rounding, not bitwise.
//
// As axolotl's TiledMLP (ALST): memory traded for one more forward of the block per shard in backward.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"

namespace ax::models {

// The process's shard count ([train] tiled_mlp; set for the run by train_from_config); 1 = untiled (default).
void set_mlp_tiles(int64_t n);
int64_t mlp_tiles();

class MlpTilesScope {
 public:
  explicit MlpTilesScope(int64_t n) : previous_(mlp_tiles()) { set_mlp_tiles(n); }
  ~MlpTilesScope() { set_mlp_tiles(previous_); }
  MlpTilesScope(const MlpTilesScope&) = delete;
  MlpTilesScope& operator=(const MlpTilesScope&) = delete;

 private:
  int64_t previous_;
};

// block(x [T', H], router_logits) -> y [T', H]; it may append one tensor of per-token router logits [T', E].
using MlpBlock = std::function<at::Tensor(const at::Tensor& x, std::vector<at::Tensor>& router_logits)>;

// block over x [T, H] in mlp_tiles() row shards (fewer when T is smaller), outputs concatenated; router logits the
// block appended, concatenated over the shards, appended to `router_logits`. Untiled: block(x, router_logits).
at::Tensor tiled_mlp(const MlpBlock& block, const at::Tensor& x, std::vector<at::Tensor>& router_logits);

// Shards tiled_mlp has run through block since the process started, recomputations included (tests).
int64_t tiled_mlp_shard_calls();

// How many shards tiled_mlp cuts `tokens` rows into (x.chunk(mlp_tiles()): fewer when the rows are few).
int64_t mlp_shard_count(int64_t tokens);

// Packed (QLoRA) expert weights under tiled_mlp, dequantised once per pass over a layer's shards instead of once
// per shard (the moe.mlp backend would decode the whole weight in every shard's call, forward and backward): the
// first shard of a pass decodes each weight into the compute dtype, the following shards of the pass take that
// dense copy, and the pass's last shard drops it (its autograd node keeps it until that shard's backward ends).
// A pass is the `shards` block calls of the layer's forward, or of its backward (each shard recomputed). The
// reference decodes into the compute dtype too, so the results are bitwise the per-shard decoding's.
// What it costs: one layer's experts dense for the span of a pass.
class ExpertWeightCache {
 public:
  explicit ExpertWeightCache(int64_t shards) : shards_(shards) {}
  // `packed` dense in `dtype`: decoded on the pass's first call for `name`, the same tensor until its last.
  ops::WeightTensor get(const std::string& name, const ops::WeightTensor& packed, at::ScalarType dtype);

 private:
  struct Entry {
    ops::WeightTensor dense;
    int64_t uses = 0;
  };
  int64_t shards_;
  std::map<std::string, Entry> entries_;
};

// The cache of the block call running on this thread (set by ExpertCacheScope), or null.
ExpertWeightCache* current_expert_cache();
class ExpertCacheScope {
 public:
  explicit ExpertCacheScope(ExpertWeightCache* c);
  ~ExpertCacheScope();
  ExpertCacheScope(const ExpertCacheScope&) = delete;
  ExpertCacheScope& operator=(const ExpertCacheScope&) = delete;

 private:
  ExpertWeightCache* previous_;
};

// Expert weights decoded by ExpertWeightCache since the process started (tests: an injected counter).
int64_t expert_dequant_calls();

}  // namespace ax::models
