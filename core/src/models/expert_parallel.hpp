// Expert parallelism's dispatch (docs/distributed.md, "Expert parallelism"): one MoE layer's moe.mlp call over
// experts spread across the ranks of an expert-parallel group.
#pragma once
#include <memory>

#include <ATen/core/Tensor.h>

#include "axengine/expert_parallel.hpp"
#include "axengine/ops/moe_mlp.hpp"

namespace ax::models {

// `a` is the call one process would make (x [T, H], routing over all `num_experts` experts, gates [T, k])
// except that its weights, biases and LoRA factors hold only this rank's experts, [rank·E/N, (rank+1)·E/N).
// Routes as given (the router is replicated), sends each token once to every rank owning one of its experts
// (counts first, then the rows and gates: two all-to-alls), runs `op` there on the received rows with their
// expert ids made local (-1 for a slot whose expert lives elsewhere: it contributes nothing), and sends the
// gated sums back to be added up per token. Differentiable in x, gates and the LoRA factors: the gradient of
// the dispatch all-to-all is the reverse all-to-all, and the other way round. Every rank of the group must
// call it for the same layers in the same order (forward and backward): the all-to-alls are collectives.
at::Tensor expert_parallel_mlp(ExpertComm& comm, const std::shared_ptr<ops::MoeMlp>& op, ops::MoeMlpArgs a,
                               int64_t num_experts);

}  // namespace ax::models
