// Ring attention for context parallelism (models/context_parallel.hpp, docs/distributed.md "Context
// parallelism"): each rank holds the q, k and v of its two zig-zag chunks of every row; the K/V blocks travel
// around the group's ring (ContextComm::ring_pass_start, size - 1 steps, the next block in flight while the held
// one is computed) and each rank attends its own queries over every block its samples reach, merging the blocks'
// (out, logsumexp) with the online softmax. Chunk pairs that the causal mask (or a sliding window) hides entirely
// are skipped; the rest are masked per token by sample (the batch's cu_seqlens: samples never see each other,
// wherever the chunks cut them), causality and window. Backward goes around the ring again: dq stays home, dK/dV
// follow their blocks one pass behind and arrive back at their owner after the last step. K/V resident per rank:
// its own block and the one in flight, O(T/N).
//
// The blocks are computed by the attention op's reference math (fp32 scores, masked softmax, in query pieces
// that bound the score memory), not by a flash backend: the op's contract takes one cu_seqlens for queries and
// keys, and a block of a rank's queries against another rank's keys needs separate ones with a causal offset.
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/ops/attention.hpp"
#include "models/context_parallel.hpp"

namespace ax::models {

// `a` as the attention op takes it, but q, k and v are this rank's tokens [split.rows·split.block(), H, D]
// (split.local of the whole batch's) and cu_seqlens is the whole batch's. Causal only; sinks (differentiable)
// and sliding windows as the op; groups refused. Returns this rank's out [rows·block, Hq, Dv] in q's dtype,
// differentiable in q, k, v and sinks.
at::Tensor ring_attention(const ContextSplit& split, const ops::AttentionArgs& a);

}  // namespace ax::models
