// A c10d process group (TCPStore rendezvous, then ProcessGroupNCCL on CUDA or ProcessGroupGloo on the CPU)
// and the few collectives the trainer needs. c10d's headers stay behind this file: only dist_group.cpp,
// dist_gloo.cpp and dist_nccl.cpp include them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/device.hpp"
#include "train/dist_config.hpp"

namespace ax::train {

class DistGroup {
 public:
  // Rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 serves the TCPStore) and the backend's own connections;
  // RuntimeError naming the rank and address when the others do not come within timeout_s.
  static std::unique_ptr<DistGroup> join(const DistEnv& env, const DistributedConfig& config, const DeviceInfo& device);
  ~DistGroup();

  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }
  const std::string& backend() const { return backend_; }

  // Sum over the ranks, in place.
  void all_reduce_sum(at::Tensor& t);
  // Every tensor replaced by its mean over the ranks: flattened into buckets of about `bucket_bytes` (one
  // dtype each), one all-reduce a bucket, copied back. Tensors must be contiguous-able and on one device.
  void all_reduce_mean(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes);
  // Rank 0's values into every rank's tensors (in buckets like all_reduce_mean).
  void broadcast_from_0(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes);
  void barrier();

  // A sub process group of `ranks` (this rank among them) over the same TCPStore, under its own key prefix
  // `name` (unique per group in the run): what torch.distributed.new_group does. Only its members call it.
  std::unique_ptr<DistGroup> subgroup(const std::vector<int64_t>& ranks, const std::string& name) const;
  // c10d alltoall_base: dim 0 of `in` split as in_splits goes rank by rank, `out` (sum(out_splits) rows,
  // preallocated) receives theirs. Tensors on the backend's device, contiguous.
  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits);
  // Every rank's `in` (one shape on all ranks) concatenated along dim 0 in rank order.
  at::Tensor all_gather(const at::Tensor& in);

  struct Impl;

 private:
  explicit DistGroup(std::unique_ptr<Impl> impl, int64_t rank, int64_t world, std::string backend);
  std::unique_ptr<Impl> impl_;
  int64_t rank_, world_;
  std::string backend_;
};

}  // namespace ax::train
