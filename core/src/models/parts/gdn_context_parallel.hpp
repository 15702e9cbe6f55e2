// Context parallelism for the Gated DeltaNet layers (qwen3_5, qwen3_5_moe, qwen3_next; docs/distributed.md,
// "Context parallelism"): the mixer's two ops over this rank's zig-zag chunks of every row (models/context_parallel.hpp),
// giving what the ops give over the whole rows.
//
// - causal_conv1d: a chunk's first W-1 outputs read the W-1 inputs before it, the tail of the row's previous
//   chunk (held by another rank, or by this one). Every rank's chunk tails are all-gathered (ContextSplit::gather:
//   W-1 rows per chunk, differentiable) and enter the op as the initial_state of the chunk's first sequence,
//   masked to the tokens of that sequence (zero where a sample starts, as the op's packing reset).
// - linear_attention: the state entering a chunk is the one leaving the row's previous chunk. The chunks run in
//   row order 0 → 1 → … → 2N-1 (rank 0, 1, …, N-1, then N-1, …, 0: the zig-zag), each from the state handed to it
//   (the op's initial_state, the leaving one its final_state); backward walks the chain back with the op's
//   dinitial_state / grad_final_state. A hop no row continues across (a sample starts at the chunk) is skipped.
//
// Why a sequential chain, not a parallel scan of the chunks' state transitions: the rule is affine in the state,
// S_out = A·S_in + B with A a product of (I - β k kᵀ)·e^g over the chunk (Dk×Dk per value head), so each rank
// could compute its chunks' (A, B) at once and combine them by a scan — but A is another Dk×Dk matrix per head
// to build (a second op call with the identity as state and zero values) and to differentiate, the outputs need
// the correction Sᵀ·A_tᵀ q per token, and the results are no longer the op's own over the row. The chain calls
// the op exactly as one process does (bit for bit with the reference backend), at the cost of the linear
// layers' time: ranks wait for their turn (2N chunk-calls in a row instead of 2 in parallel), so these layers
// gain memory (1/N of the activations) but not speed. The attention layers still split their work N ways.
#pragma once
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "models/context_parallel.hpp"

namespace ax::models {

class GdnContextSplit {
 public:
  // The samples are the split's host table (ContextSplit::cu): no tensor is read back.
  explicit GdnContextSplit(const ContextSplit& split);

  // The op over this rank's tokens: args.x [rows·block, C] (split.local of the whole batch's); args.cu_seqlens,
  // initial_state and output_final_state are this function's. Returns y [rows·block, C], differentiable in x.
  // Refuses a kernel wider than a chunk + 1 (its window would reach past the previous chunk).
  at::Tensor conv1d(const std::shared_ptr<ops::CausalConv1d>& op, ops::CausalConv1dArgs args) const;
  // The op over this rank's tokens: q, k, v, g, beta [rows·block, ...]; args.cu_seqlens, initial_state and
  // output_final_state are this function's. Returns out [rows·block, Hv, Dv], differentiable in q, k, v, g, beta.
  at::Tensor linear_attention(const std::shared_ptr<ops::LinearAttention>& op, ops::LinearAttentionArgs args) const;

  // This rank's chunks `js` (0: its first, 1: its second) of every row, row by row, as the op's packed
  // sequences: a chunk starts a sequence, and so does every sample start inside it.
  struct Sequences {
    at::Tensor cu;                   // int32 [n + 1] over the chunks' tokens (on the host)
    std::vector<int64_t> first, last;  // per (row, j), rows outer: its first and last sequence
    std::vector<int64_t> carried;      // the (row, j) entries whose first token continues a sample (index into first)
  };
  Sequences sequences(const std::vector<int64_t>& js) const;
  // Whether row b's chunk k (0 .. 2N-1) starts inside a sample that began in an earlier chunk.
  bool continues(int64_t b, int64_t k) const;
  // The sample (index into cu_seqlens) the whole batch's token p belongs to.
  int64_t sample_of(int64_t p) const;

  const ContextSplit& split() const { return split_; }

 private:
  ContextSplit split_;
  std::vector<int64_t> cu_;  // split_.cu's table, checked
};

}  // namespace ax::models
