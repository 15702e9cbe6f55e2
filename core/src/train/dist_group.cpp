#include "train/dist_group.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>

#include <algorithm>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "train/dist_backend.hpp"

namespace ax::train {

struct DistGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  at::Device device{at::kCPU};  // where the backend's tensors live: the CPU (gloo) or this rank's GPU (nccl)
  int64_t timeout_s = 0;
};

namespace {

// c10d's messages run to many lines (a C++ stack on some builds): the first says what failed.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Runs a collective; what c10d throws when a peer is gone or late becomes one RuntimeError that says so.
template <class F>
void collective(const DistGroup& g, int64_t timeout_s, const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    throw RuntimeError(ax::str("distributed: rank ", g.rank(), " of ", g.world(), " (", g.backend(), "): ", what, " failed: ",
                           first_line(e.what()), ". Another rank exited or stopped answering (timeout_s = ", timeout_s,
                           "); its log says why. Stopping this rank."));
  }
}

std::vector<std::vector<at::Tensor>> buckets_of(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  std::vector<std::vector<at::Tensor>> out;
  for (auto [b, e] : bucket_spans(tensors, bucket_bytes))
    out.emplace_back(tensors.begin() + static_cast<std::ptrdiff_t>(b), tensors.begin() + static_cast<std::ptrdiff_t>(e));
  return out;
}

// One buffer on the backend's device (a CPU tensor such as an optimizer's step count travels to the GPU
// under nccl); unflatten_into copies back across devices.
at::Tensor flat(const std::vector<at::Tensor>& bucket, const at::Device& device) {
  std::vector<at::Tensor> views;
  for (const auto& t : bucket) views.push_back(t.reshape({-1}).to(device));
  return at::cat(views);
}

void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& bucket) {
  int64_t at = 0;
  for (const auto& t : bucket) {
    t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

}  // namespace

std::vector<std::pair<std::size_t, std::size_t>> bucket_spans(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  int64_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
    if (out.empty() || tensors[out.back().first].scalar_type() != t.scalar_type() || bytes + b > bucket_bytes) {
      out.emplace_back(i, i);
      bytes = 0;
    }
    out.back().second = i + 1;
    bytes += b;
  }
  return out;
}

DistGroup::DistGroup(std::unique_ptr<Impl> impl, int64_t rank, int64_t world, std::string backend)
    : impl_(std::move(impl)), rank_(rank), world_(world), backend_(std::move(backend)) {}

DistGroup::~DistGroup() = default;

std::unique_ptr<DistGroup> DistGroup::join(const DistEnv& env, const DistributedConfig& config, const DeviceInfo& device) {
  std::string backend = config.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  if (backend == "nccl" && !device.is_cuda())
    throw UsageError("[distributed] backend = \"nccl\" needs a CUDA device; this run is on the CPU (use \"gloo\" or \"auto\")");
  const auto timeout = std::chrono::milliseconds(config.timeout_s * 1000);
  auto impl = std::make_unique<Impl>();
  impl->timeout_s = config.timeout_s;
  if (backend == "nccl") impl->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
  log::info(ax::str("distributed: rank ", env.rank, " of ", env.world, " (local rank ", env.local_rank, "), ", backend,
                    ", rendezvous at ", env.master_addr, ":", env.master_port));
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env.master_port);
    o.isServer = env.rank == 0;
    o.numWorkers = static_cast<std::size_t>(env.world);
    o.waitWorkers = true;
    o.timeout = timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
    // One prefix per group so that a second group (a later feature: expert parallelism) can share the store.
    auto store = c10::make_intrusive<c10d::PrefixStore>("axengine/default", impl->store);
    const int r = static_cast<int>(env.rank), w = static_cast<int>(env.world);
    impl->backend = backend == "nccl" ? make_nccl_backend(store, r, w, timeout, static_cast<int>(device.index))
                                      : make_gloo_backend(store, r, w, timeout);
  } catch (const UsageError&) {
    throw;
  } catch (const RuntimeError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError(ax::str("distributed: rank ", env.rank, " of ", env.world, " could not join the process group at ",
                               env.master_addr, ":", env.master_port, " within timeout_s = ", config.timeout_s, ": ",
                               first_line(e.what())));
  }
  return std::unique_ptr<DistGroup>(new DistGroup(std::move(impl), env.rank, env.world, backend));
}

void DistGroup::all_reduce_sum(at::Tensor& t) {
  collective(*this, impl_->timeout_s, "all-reduce", [&] {
    std::vector<at::Tensor> v{t};
    impl_->backend->allreduce(v)->wait();
  });
}

at::Device DistGroup::device() const { return impl_->device; }

namespace {
class C10dWork final : public DistWork {
 public:
  C10dWork(const DistGroup& g, int64_t timeout_s, c10::intrusive_ptr<c10d::Work> w, const char* what = "all-reduce")
      : g_(g), timeout_s_(timeout_s), what_(what), w_(std::move(w)) {}
  void wait() override {
    if (!w_) return;
    collective(g_, timeout_s_, what_, [&] { w_->wait(); });
    w_.reset();
  }

 private:
  const DistGroup& g_;
  int64_t timeout_s_;
  const char* what_;
  c10::intrusive_ptr<c10d::Work> w_;
};
}  // namespace

std::unique_ptr<DistWork> DistGroup::all_reduce_sum_async(const at::Tensor& t) {
  c10::intrusive_ptr<c10d::Work> w;
  collective(*this, impl_->timeout_s, "all-reduce", [&] {
    std::vector<at::Tensor> v{t};
    w = impl_->backend->allreduce(v);
  });
  return std::make_unique<C10dWork>(*this, impl_->timeout_s, std::move(w));
}

void DistGroup::all_gather(at::Tensor& out, at::Tensor& shard) {
  collective(*this, impl_->timeout_s, "all-gather", [&] { impl_->backend->_allgather_base(out, shard)->wait(); });
}

std::unique_ptr<DistWork> DistGroup::all_gather_async(at::Tensor& out, at::Tensor& shard) {
  c10::intrusive_ptr<c10d::Work> w;
  collective(*this, impl_->timeout_s, "all-gather", [&] { w = impl_->backend->_allgather_base(out, shard); });
  return std::make_unique<C10dWork>(*this, impl_->timeout_s, std::move(w), "all-gather");
}

void DistGroup::broadcast_from_0(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  for (const auto& bucket : buckets_of(tensors, bucket_bytes)) {
    at::Tensor f = flat(bucket, impl_->device);
    collective(*this, impl_->timeout_s, "broadcast", [&] {
      std::vector<at::Tensor> v{f};
      c10d::BroadcastOptions o;
      o.rootRank = 0;
      impl_->backend->broadcast(v, o)->wait();
    });
    unflatten_into(f, bucket);
  }
}

std::unique_ptr<DistGroup> DistGroup::subgroup(const std::vector<int64_t>& ranks, const std::string& name) const {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) throw RuntimeError(ax::str("distributed: rank ", rank_, " is not in sub group ", name));
  const int r = static_cast<int>(me - ranks.begin()), w = static_cast<int>(ranks.size());
  auto impl = std::make_unique<Impl>();
  impl->store = impl_->store;
  impl->device = impl_->device;
  impl->timeout_s = impl_->timeout_s;
  const auto timeout = std::chrono::milliseconds(impl_->timeout_s * 1000);
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("axengine/" + name, impl_->store);
    impl->backend = backend_ == "nccl" ? make_nccl_backend(store, r, w, timeout, impl_->device.index())
                                       : make_gloo_backend(store, r, w, timeout);
  } catch (const RuntimeError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError(ax::str("distributed: rank ", rank_, " of ", world_, " could not form the sub group ", name,
                               " within timeout_s = ", impl_->timeout_s, ": ", first_line(e.what())));
  }
  return std::unique_ptr<DistGroup>(new DistGroup(std::move(impl), r, w, backend_));
}

void DistGroup::all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits) {
  all_to_all_async(out, in, out_splits, in_splits)->wait();
}

std::unique_ptr<DistWork> DistGroup::all_to_all_async(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                                      const std::vector<int64_t>& in_splits) {
  c10::intrusive_ptr<c10d::Work> w;
  collective(*this, impl_->timeout_s, "all-to-all", [&] {
    std::vector<int64_t> o = out_splits, i = in_splits;  // the work keeps copies of the splits
    at::Tensor src = in;  // alltoall_base takes non-const references; it only reads the input
    w = impl_->backend->alltoall_base(out, src, o, i);
  });
  return std::make_unique<C10dWork>(*this, impl_->timeout_s, std::move(w), "all-to-all");
}

at::Tensor DistGroup::all_gather(const at::Tensor& in) {
  at::Tensor src = in.contiguous();
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < world_; ++r) parts.push_back(at::empty_like(src));
  collective(*this, impl_->timeout_s, "all-gather", [&] {
    std::vector<std::vector<at::Tensor>> outs{parts};
    std::vector<at::Tensor> ins{src};
    impl_->backend->allgather(outs, ins)->wait();
    parts = outs[0];
  });
  return at::cat(parts, 0);
}

void DistGroup::barrier() {
  collective(*this, impl_->timeout_s, "barrier", [&] { impl_->backend->barrier()->wait(); });
}

}  // namespace ax::train
