// Expert parallelism ([distributed] expert_parallel, docs/distributed.md): the collectives a MoE model needs
// to spread its experts over the ranks of one expert-parallel group. The trainer implements them over a
// c10d sub process group (train/dist_expert.cpp); a model sees only this interface, so model code needs no
// c10d header and a single process never pays for it.
#pragma once
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax {

class ExpertComm {
 public:
  virtual ~ExpertComm() = default;
  // This rank's position in its expert-parallel group and the group's size: rank r holds experts
  // [r·E/size, (r+1)·E/size).
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  // Rows of `in` (contiguous, dim 0 split as in_splits, one entry per rank of the group) go to the ranks;
  // `out` (preallocated, sum(out_splits) rows) receives theirs, rank by rank (c10d alltoall_base).
  virtual void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                          const std::vector<int64_t>& in_splits) = 0;
  // Every rank's `in` (same shape on all ranks), concatenated along dim 0 in rank order.
  virtual at::Tensor all_gather(const at::Tensor& in) = 0;
};

}  // namespace ax
