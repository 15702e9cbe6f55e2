// The storage half of `shard_base` (issue 23, part 3; docs/distributed.md): a set of frozen tensors of which
// this rank keeps 1/world, gathered whole only while they are used.
//
// Each tensor's flat bytes (whatever its dtype: bf16/fp32 values, packed nf4/mxfp4/nvfp4 codes and their
// scales alike, so a packed weight shards the same way as a dense one) are padded to a multiple of world and
// cut into equal chunks; rank r keeps chunk r, a copy of its own (the full tensor is released). gather()
// all-gathers one tensor back into a fresh buffer, returned as a tensor of the original dtype and shape: the
// caller holds it for as long as it is used (a layer's forward, then again its recomputation in backward)
// and drops it after.
//
// shard_base (train/dist_shard_base.cpp) keeps one flat tensor per decoder layer here: one gather a layer.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "train/dist_group.hpp"

namespace ax::train {

class ShardedTensors {
 public:
  // Takes `tensors` (contiguous-able, any dtype and device): keeps this rank's chunk of each.
  ShardedTensors(DistGroup& group, const std::vector<at::Tensor>& tensors);
  // Keeps this rank's chunk of one more tensor (index size() before the call); the caller may then drop it.
  void add(const at::Tensor& t);
  // The same for a uint8 buffer of `total` bytes that is never built whole: it is zero but for `pieces`,
  // each a tensor's bytes at an offset (ascending, not overlapping). Only this rank's chunk is allocated and
  // filled from the pieces it overlaps: cutting a layer costs its chunk, not another copy of the layer.
  // gather() returns the buffer, uint8 [total], as add() of the built buffer would.
  struct Piece {
    at::Tensor tensor;  // any dtype, contiguous-able
    int64_t offset = 0;
  };
  void add_pieces(int64_t total, const std::vector<Piece>& pieces);

  std::size_t size() const { return entries_.size(); }
  // Tensor i whole again (a collective: every rank calls it for the same i, in the same order).
  at::Tensor gather(std::size_t i) const;
  // The same gather, started and not waited for (NCCL: on the process group's stream, after what the
  // current stream enqueued so far; Gloo: on its worker threads). wait() returns the tensor.
  class Pending {
   public:
    at::Tensor wait();
    std::size_t index() const { return i_; }

   private:
    friend class ShardedTensors;
    std::unique_ptr<DistWork> work_;
    at::Tensor out_, view_;
    std::size_t i_ = 0;
  };
  Pending gather_async(std::size_t i) const;
  // The bytes this rank holds for the set (its chunks, padding included).
  int64_t resident_bytes() const;

 private:
  struct Entry {
    at::Tensor chunk;            // uint8 [chunk_bytes]: this rank's part of the flat bytes
    int64_t bytes = 0;           // the tensor's own byte count
    std::vector<int64_t> shape;
    at::ScalarType dtype{};
  };
  DistGroup& group_;
  std::vector<Entry> entries_;
};

}  // namespace ax::train
