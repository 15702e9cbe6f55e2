// Ring attention for context parallelism (models/context_parallel.hpp, docs/distributed.md "Context
// parallelism"): each rank holds the q, k and v of its two zig-zag chunks of every row; the K/V blocks travel
// around the group's ring (ContextComm::ring_pass_start, size - 1 steps, the next block in flight while the held
// one is computed) and each rank attends its own queries over every block its samples reach, merging the blocks'
// (out, logsumexp) with the online softmax in fp32. Chunk pairs that the causal mask (or a sliding window) hides
// entirely are skipped. The rest run through the attention op (the selected backend: flash on a GPU), its samples'
// pieces as varlen sequences with the keys' own boundaries (cu_seqlens_k): a chunk against itself causal, an
// earlier key chunk unmasked (left-windowed under a sliding window), samples never seeing each other wherever the
// chunks cut them. Backward goes around the ring again, each op call's backward handed the merged (out, lse): dq
// stays home, dK/dV follow their blocks one pass behind and arrive back at their owner after the last step. K/V
// resident per rank: its own block and the one in flight, O(T/N).
#pragma once
#include <memory>

#include <ATen/core/Tensor.h>

#include "axengine/ops/attention.hpp"
#include "models/context_parallel.hpp"

namespace ax::models {

// `a` as the attention op takes it, but q, k and v are this rank's tokens [split.rows·split.block(), H, D]
// (split.local of the whole batch's); the samples are the split's host table (ContextSplit::cu; a.cu_seqlens is not
// read). Causal only; sinks (differentiable)
// and sliding windows as the op; groups and cu_seqlens_k refused. `blocks` computes the blocks (the model's
// attention backend chain; null: the reference backend). Returns this rank's out [rows·block, Hq, Dv] in q's
// dtype, differentiable in q, k, v and sinks.
at::Tensor ring_attention(const ContextSplit& split, const ops::AttentionArgs& a,
                          std::shared_ptr<ops::Attention> blocks = nullptr);

// ring_attention's forward and, given ∂L/∂out, its backward, run here without autograd: what its autograd node
// computes (dsinks when a.sinks is defined). For callers that cannot leave the backward to autograd: several
// ranks' threads on one CUDA device (the tests), whose nodes autograd would run one after another on that
// device's one backward thread, each waiting for the others' ring passes.
struct RingGrads {
  at::Tensor out, dq, dk, dv, dsinks;
};
RingGrads ring_attention_grads(const ContextSplit& split, const ops::AttentionArgs& a, const at::Tensor& grad_out,
                               std::shared_ptr<ops::Attention> blocks = nullptr);

}  // namespace ax::models
