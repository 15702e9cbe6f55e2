// Data parallelism's gradient mean, overlapped with backward (docs/distributed.md, "Gradients").
//
// The LoRA parameters are cut into buckets (bucket_spans: consecutive parameters of one dtype, about
// bucket_bytes each, in registration order). A hook on every parameter fires when autograd has accumulated
// its .grad; on the last micro-batch of a step (arm(true)) the hook marks the parameter ready, and a bucket
// whose parameters are all ready is flattened into its own preallocated buffer and its all-reduce started
// at once, while backward goes on with the earlier layers. Buckets start in one fixed order on every rank
// (the last bucket first: backward reaches the last layers first), a bucket only after the ones before it
// in that order: c10d needs every rank to issue the same collectives in the same order, and which
// parameter is ready first may differ between ranks (an expert only one rank's tokens reached).
//
// finish(), after the last backward, marks what got no gradient in the step as zeros (so every rank reduces
// the same tensors), starts the buckets still waiting, waits for all of them, divides by the world and makes
// each parameter's .grad a view of its bucket (no copy back). The buckets and the reduction are those of
// the former reduce-after-backward path, so the sums are bitwise the same.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/dist_group.hpp"

namespace ax::train {

class GradReducer {
 public:
  // Installs the hooks on `params` (leaves that require grad, kept in this order); the reducer must outlive
  // every backward through them, and removes the hooks when destroyed.
  GradReducer(DistGroup& group, std::vector<at::Tensor> params, int64_t bucket_bytes);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Before each backward of a step: `last` = this backward completes the step's gradients (the last
  // micro-batch of an accumulation window). The others only accumulate: no collective (no_sync).
  void arm(bool last);
  // After the last backward: every parameter's .grad is the mean over the ranks (defined for all of them).
  void finish();

  std::size_t buckets() const { return spans_.size(); }
  // Buckets of the last finished step whose all-reduce started from a hook, i.e. while backward still ran.
  int64_t launched_in_backward() const { return launched_in_backward_; }

  void on_grad(std::size_t param);  // the hook (public for it; not for callers)

 private:
  void launch_ready();  // starts the next buckets in order while they are complete
  void launch(std::size_t bucket);

  DistGroup& group_;
  std::vector<at::Tensor> params_;
  std::vector<std::pair<std::size_t, std::size_t>> spans_;  // bucket -> [first, last) parameter
  std::vector<std::size_t> bucket_of_;                      // parameter -> bucket
  std::vector<int64_t> offset_;                             // parameter -> element offset in its bucket
  std::vector<at::Tensor> buffers_;                         // bucket -> flat buffer on the group's device
  std::vector<std::unique_ptr<DistWork>> works_;            // bucket -> its all-reduce in flight
  std::vector<char> ready_;                                 // parameter -> its gradient is final this step
  std::vector<std::size_t> missing_;                        // bucket -> parameters not ready yet
  std::size_t launched_ = 0;                                // buckets started, in launch order
  bool armed_ = false;
  int64_t launched_in_backward_ = 0;
  std::mutex mu_;  // the hooks run on autograd's threads (one per device)
};

}  // namespace ax::train
