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
#include <vector>

#include <ATen/core/Tensor.h>

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

}  // namespace ax::models
