// A c10d process group (TCPStore rendezvous, then ProcessGroupNCCL on CUDA or ProcessGroupGloo on the CPU)
// and the few collectives the trainer needs. c10d's headers stay behind this file: only dist_group.cpp,
// dist_gloo.cpp and dist_nccl.cpp include them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/device.hpp"
#include "train/dist_config.hpp"

namespace ax::train {

// Consecutive tensors of one dtype, up to about `bucket_bytes` each (a tensor larger than that is its own
// bucket): the [begin, end) index ranges. The gradient reducer and the broadcast share this rule, so a
// bucket holds the same tensors whichever path reduces it.
std::vector<std::pair<std::size_t, std::size_t>> bucket_spans(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes);

// A collective in flight (all_reduce_sum_async).
class DistWork {
 public:
  virtual ~DistWork() = default;
  // Returns when the result may be used: NCCL makes the current stream wait for the group's stream (the
  // host goes on), Gloo blocks the host until the sum is there. Throws like the blocking collectives.
  virtual void wait() = 0;
};

class DistGroup {
 public:
  // Rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 serves the TCPStore) and the backend's own connections;
  // RuntimeError naming the rank and address when the others do not come within timeout_s.
  static std::unique_ptr<DistGroup> join(const DistEnv& env, const DistributedConfig& config, const DeviceInfo& device);
  ~DistGroup();

  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }
  const std::string& backend() const { return backend_; }

  // Where the backend's tensors live: the CPU (gloo) or this rank's GPU (nccl).
  at::Device device() const;

  // Sum over the ranks, in place.
  void all_reduce_sum(at::Tensor& t);
  // The same, started and not waited for: NCCL runs it on the group's own stream after what the current
  // stream enqueued so far, Gloo on its worker threads. `t` (on device()) must not be touched before wait().
  std::unique_ptr<DistWork> all_reduce_sum_async(const at::Tensor& t);
  // Every rank's `shard` (1-D, the same numel on every rank) into `out` (1-D, world x that numel), rank r's
  // at [r * numel, (r + 1) * numel). Blocking like all_reduce_sum.
  void all_gather(at::Tensor& out, at::Tensor& shard);
  // The same, started and not waited for (as all_reduce_sum_async): `out` holds the result after wait().
  std::unique_ptr<DistWork> all_gather_async(at::Tensor& out, at::Tensor& shard);
  // Rank 0's values into every rank's tensors (in buckets cut by bucket_spans, as the gradient reducer's).
  void broadcast_from_0(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes);
  void barrier();

  // A sub process group of `ranks` (this rank among them) over the same TCPStore, under its own key prefix
  // `name` (unique per group in the run): what torch.distributed.new_group does. Only its members call it.
  std::unique_ptr<DistGroup> subgroup(const std::vector<int64_t>& ranks, const std::string& name) const;
  // c10d alltoall_base: dim 0 of `in` split as in_splits goes rank by rank, `out` (sum(out_splits) rows,
  // preallocated) receives theirs. Tensors on the backend's device, contiguous.
  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits);
  // The same, started and not waited for (as all_reduce_sum_async): `out` holds the result after wait().
  std::unique_ptr<DistWork> all_to_all_async(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
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
