#include "train/dist_shard.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>

namespace ax::train {

ShardedTensors::ShardedTensors(DistGroup& group, const std::vector<at::Tensor>& tensors) : group_(group) {
  for (const at::Tensor& t : tensors) add(t);
}

void ShardedTensors::add(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  // As bytes: one rule for every dtype, packed formats included (a 4-bit code pair is one uint8 already).
  at::Tensor bytes = t.contiguous().reshape({-1}).view(at::kByte);
  add_pieces(bytes.numel(), {{bytes, 0}});
  entries_.back().shape = t.sizes().vec();
  entries_.back().dtype = t.scalar_type();
}

void ShardedTensors::add_pieces(int64_t total, const std::vector<Piece>& pieces) {
  at::NoGradGuard no_grad;
  const int64_t world = group_.world(), rank = group_.rank();
  Entry e;
  e.shape = {total};
  e.dtype = at::kByte;
  e.bytes = total;
  const int64_t chunk = (total + world - 1) / world;
  const int64_t from = std::min(total, rank * chunk), to = std::min(total, from + chunk);
  // On the backend's device (the collective runs there), zero-padded to the common chunk size.
  e.chunk = at::zeros({chunk}, at::TensorOptions().dtype(at::kByte).device(group_.device()));
  for (const Piece& p : pieces) {
    if (!p.tensor.defined()) continue;
    at::Tensor bytes = p.tensor.contiguous().reshape({-1}).view(at::kByte);
    // The part of [offset, offset + n) that falls in this rank's [from, to).
    const int64_t lo = std::max(from, p.offset), hi = std::min(to, p.offset + bytes.numel());
    if (hi > lo) e.chunk.narrow(0, lo - from, hi - lo).copy_(bytes.narrow(0, lo - p.offset, hi - lo));
  }
  entries_.push_back(std::move(e));
}

at::Tensor ShardedTensors::gather(std::size_t i) const {
  at::NoGradGuard no_grad;
  const Entry& e = entries_.at(i);
  at::Tensor out = at::empty({e.chunk.numel() * group_.world()}, e.chunk.options());
  at::Tensor chunk = e.chunk;
  group_.all_gather(out, chunk);
  return out.narrow(0, 0, e.bytes).view(e.dtype).view(e.shape);
}

ShardedTensors::Pending ShardedTensors::gather_async(std::size_t i) const {
  at::NoGradGuard no_grad;
  const Entry& e = entries_.at(i);
  Pending p;
  p.i_ = i;
  p.out_ = at::empty({e.chunk.numel() * group_.world()}, e.chunk.options());
  p.view_ = p.out_.narrow(0, 0, e.bytes).view(e.dtype).view(e.shape);
  at::Tensor chunk = e.chunk;
  p.work_ = group_.all_gather_async(p.out_, chunk);
  return p;
}

at::Tensor ShardedTensors::Pending::wait() {
  if (work_) work_->wait();
  work_.reset();
  out_ = at::Tensor();
  return std::exchange(view_, at::Tensor());
}

int64_t ShardedTensors::resident_bytes() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.chunk.numel();
  return n;
}

}  // namespace ax::train
