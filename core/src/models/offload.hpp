// Activation offload ([train] activation_offload, docs/training.md "Long context"): with activation checkpointing,
// each decoder layer keeps only its input x for backward (models/recompute.hpp). Offloaded, that input goes to
// host memory right after the layer's forward is queued and comes back before the layer's backward, so the
// device holds a couple of layer inputs instead of one per layer.
//
// On a GPU: x is copied into pinned host memory on a side stream of x's device, after the work queued so far on
// the compute stream (an event), so the copy overlaps the layer's compute; x.record_stream(side) keeps the
// caching allocator from handing x's memory to anything else before the copy has read it. Bringing it back
// (prefetch) copies it into a fresh device buffer on the same side stream (hence after the host copy finished)
// and records an event; take() makes the compute stream wait on that event and records the buffer's use there.
// Each stash links to the one stashed before it on this thread (the layer below), so the backward of layer i
// prefetches layer i-1's input while layer i recomputes. A link is only a hint: take() loads what was not
// prefetched, and a link to a graph already freed has expired.
//
// On the CPU there is nothing to move (x already lives in host memory): recompute keeps x as it is. The
// internal mode CheckpointStore::kHostCopy copies it to a separate host buffer anyway, so a CPU test runs the
// offload path (stash, link, prefetch, take) and can compare it bitwise with the plain run.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

namespace ax::autograd {

// Where recompute() keeps each checkpoint's input between forward and backward.
enum class CheckpointStore {
  kDevice,    // where it is (no offload)
  kHost,      // a GPU input goes to pinned host memory; a CPU one stays where it is (already host memory)
  kHostCopy,  // as kHost, and a CPU input is copied to a separate host buffer too (tests)
};

// The process's setting ([train] activation_offload; set for the run by train_from_config), read by each
// recompute() call when its forward runs. Defaults to kDevice.
void set_checkpoint_store(CheckpointStore store);
CheckpointStore checkpoint_store();

// Sets the store for its lifetime and puts the previous one back.
class CheckpointStoreScope {
 public:
  explicit CheckpointStoreScope(CheckpointStore store) : previous_(checkpoint_store()) { set_checkpoint_store(store); }
  ~CheckpointStoreScope() { set_checkpoint_store(previous_); }
  CheckpointStoreScope(const CheckpointStoreScope&) = delete;
  CheckpointStoreScope& operator=(const CheckpointStoreScope&) = delete;

 private:
  CheckpointStore previous_;
};

// Whether `store` moves x off its device.
bool offloads(CheckpointStore store, const at::Tensor& x);

// Counts since the process started (tests: the path ran, and the prefetch chain held).
struct OffloadCounts {
  int64_t stashed = 0;     // inputs copied to host memory
  int64_t prefetched = 0;  // inputs brought back ahead of their backward (by the layer above's backward)
  int64_t taken = 0;       // inputs handed to a backward
};
OffloadCounts offload_counts();

// One layer input in host memory.
class OffloadedInput {
 public:
  // Starts copying x to host memory (see above). The caller may drop x once this returns.
  static std::shared_ptr<OffloadedInput> stash(const at::Tensor& x);
  // Starts bringing it back onto its device, if not started yet.
  void prefetch();
  // The input back on its device, ready for the current stream; then starts prefetching the input stashed before
  // this one. Each call gives a fresh copy (a backward run twice with retain_graph takes it twice).
  at::Tensor take();

 private:
  OffloadedInput() = default;
  void load(bool ahead);

  at::Tensor host_;    // pinned on a GPU
  at::Tensor loaded_;  // brought back, not yet taken
  c10::Device device_{at::kCPU};
  std::optional<c10::Event> loaded_event_;  // GPU: recorded on the side stream after the copy back
  std::weak_ptr<OffloadedInput> below_;     // stashed just before this one on this thread
};

}  // namespace ax::autograd
