#include "models/offload.hpp"

#include <atomic>
#include <unordered_map>
#include <mutex>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace ax::autograd {
namespace {

std::atomic<CheckpointStore> g_checkpoint_store{CheckpointStore::kDevice};
std::atomic<int64_t> g_stashed{0}, g_prefetched{0}, g_taken{0};
// The last input stashed on this thread: the next stash's layer below. Forward runs on the caller's thread.
thread_local std::weak_ptr<OffloadedInput> t_last;

// One side stream per device for all offload copies: the copies of one device run in order on it (each copy
// back follows the copy out it reads).
c10::Stream offload_stream(c10::Device device) {
  static std::mutex mutex;
  static std::unordered_map<c10::Device, c10::Stream> streams;
  std::lock_guard lock(mutex);
  auto it = streams.find(device);
  if (it == streams.end())
    it = streams.emplace(device, c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, false)).first;
  return it->second;
}

c10::Stream offload_compute_stream(c10::Device device) { return c10::impl::VirtualGuardImpl(device.type()).getStream(device); }

}  // namespace

void set_checkpoint_store(CheckpointStore store) { g_checkpoint_store = store; }
CheckpointStore checkpoint_store() { return g_checkpoint_store; }

bool offloads(CheckpointStore store, const at::Tensor& x) {
  return store == CheckpointStore::kHostCopy || (store == CheckpointStore::kHost && !x.is_cpu());
}

OffloadCounts offload_counts() { return {g_stashed.load(), g_prefetched.load(), g_taken.load()}; }

std::shared_ptr<OffloadedInput> OffloadedInput::stash(const at::Tensor& x) {
  std::shared_ptr<OffloadedInput> s(new OffloadedInput);
  s->device_ = x.device();
  s->below_ = t_last;
  t_last = s;
  if (x.is_cpu()) {
    s->host_ = x.clone(at::MemoryFormat::Contiguous);
  } else {
    const c10::Stream compute = offload_compute_stream(s->device_), side = offload_stream(s->device_);
    c10::Event ready(s->device_.type());
    ready.record(compute);  // x is complete once what is queued so far has run
    ready.block(side);
    s->host_ = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
    {
      c10::StreamGuard on_side(side);
      s->host_.copy_(x, /*non_blocking=*/true);
    }
    // x's memory goes back to the allocator when the caller drops it: not reused before the side stream read it.
    x.record_stream(side);
  }
  ++g_stashed;
  return s;
}

void OffloadedInput::load(bool ahead) {
  if (loaded_.defined()) return;
  if (device_.is_cpu()) {
    loaded_ = host_.clone();
  } else {
    // On the side stream, after the copy out (same stream). The buffer is allocated there too: the allocator
    // reuses it for side-stream work only once the compute stream's use (record_stream in take) has finished.
    const c10::Stream side = offload_stream(device_);
    c10::StreamGuard on_side(side);
    loaded_ = at::empty(host_.sizes(), host_.options().device(device_));
    loaded_.copy_(host_, /*non_blocking=*/true);
    loaded_event_.emplace(device_.type());
    loaded_event_->record(side);
  }
  if (ahead) ++g_prefetched;
}

void OffloadedInput::prefetch() { load(true); }

at::Tensor OffloadedInput::take() {
  load(false);
  at::Tensor x = std::move(loaded_);
  loaded_ = at::Tensor();
  if (!device_.is_cpu()) {
    const c10::Stream compute = offload_compute_stream(device_);
    loaded_event_->block(compute);
    x.record_stream(compute);
    loaded_event_.reset();
  }
  ++g_taken;
  // The layer below's input comes back while this layer recomputes.
  if (auto below = below_.lock()) below->prefetch();
  return x;
}

}  // namespace ax::autograd
