#include "train/dist_reducer.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

namespace {

// Called by autograd's AccumulateGrad once the parameter's .grad holds this backward's sum (the C++ side of
// Tensor.register_post_accumulate_grad_hook).
struct ReadyHook final : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradReducer* r, std::size_t i) : reducer(r), param(i) {}
  void operator()(const torch::autograd::Variable&) override { reducer->on_grad(param); }
  GradReducer* reducer;
  std::size_t param;
};

}  // namespace

GradReducer::GradReducer(DistGroup& group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(group), params_(std::move(params)) {
  spans_ = bucket_spans(params_, bucket_bytes);
  bucket_of_.resize(params_.size());
  offset_.resize(params_.size());
  for (std::size_t b = 0; b < spans_.size(); ++b) {
    int64_t n = 0;
    for (std::size_t i = spans_[b].first; i < spans_[b].second; ++i) {
      bucket_of_[i] = b;
      offset_[i] = n;
      n += params_[i].numel();
    }
    // Allocated once: a step allocates nothing for its collectives.
    buffers_.push_back(at::empty({n}, params_[spans_[b].first].options().device(group_.device())));
  }
  works_.resize(spans_.size());
  ready_.assign(params_.size(), 0);
  missing_.assign(spans_.size(), 0);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad() || !params_[i].is_leaf())
      throw RuntimeError(ax::str("GradReducer: parameter ", i, " is not a leaf that requires grad"));
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<ReadyHook>(this, i));
  }
}

GradReducer::~GradReducer() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradReducer::arm(bool last) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!last) {
    armed_ = false;
    return;
  }
  // A step that stopped midway (an exception, an abandoned graph capture) may have left collectives in
  // flight: the ranks stopped together or the next collective fails; either way nothing is waited for here.
  for (auto& w : works_) w.reset();
  std::fill(ready_.begin(), ready_.end(), 0);
  for (std::size_t b = 0; b < spans_.size(); ++b) missing_[b] = spans_[b].second - spans_[b].first;
  launched_ = 0;
  launched_in_backward_ = 0;
  armed_ = true;
}

void GradReducer::on_grad(std::size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;  // an earlier micro-batch of the window: its gradient is not final yet
  if (ready_[i]) throw RuntimeError(ax::str("GradReducer: parameter ", i, " got its gradient twice in one backward"));
  ready_[i] = 1;
  const std::size_t launched = launched_;
  if (--missing_[bucket_of_[i]] == 0) launch_ready();
  launched_in_backward_ += static_cast<int64_t>(launched_ - launched);
}

void GradReducer::launch_ready() {
  while (launched_ < spans_.size()) {
    const std::size_t b = spans_.size() - 1 - launched_;
    if (missing_[b] != 0) return;
    launch(b);
    ++launched_;
  }
}

void GradReducer::launch(std::size_t b) {
  RECORD_USER_SCOPE("axengine::all_reduce_bucket");
  at::NoGradGuard no_grad;
  at::Tensor& buf = buffers_[b];
  const auto [first, last] = spans_[b];
  // A gradient may already be its slice of the bucket: finish() made it a view, and an optimizer whose
  // zero_grad zeroes in place (instead of dropping the gradient) keeps it, so autograd accumulated into it.
  auto in_place = [&](std::size_t i, const at::Tensor& g) {
    return g.defined() && g.is_contiguous() && g.data_ptr() == static_cast<char*>(buf.data_ptr()) + offset_[i] * buf.element_size();
  };
  bool all_copied = true;  // every gradient defined, elsewhere, on the buffer's device: one concatenation
  std::vector<at::Tensor> flat;
  for (std::size_t i = first; i < last; ++i) {
    const at::Tensor& g = params_[i].grad();
    all_copied &= g.defined() && g.device() == buf.device() && !in_place(i, g);
    if (all_copied) flat.push_back(g.reshape({-1}));
  }
  if (all_copied) {
    at::cat_out(buf, flat, 0);
  } else {
    for (std::size_t i = first; i < last; ++i) {
      const at::Tensor& g = params_[i].grad();
      if (in_place(i, g)) continue;
      at::Tensor slice = buf.narrow(0, offset_[i], params_[i].numel());
      if (g.defined()) slice.copy_(g.reshape({-1}));
      else slice.zero_();  // no gradient on this rank this step: it takes part as zeros
    }
  }
  works_[b] = group_.all_reduce_sum_async(buf);
}

void GradReducer::finish() {
  RECORD_USER_SCOPE("axengine::all_reduce_gradients");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!armed_) throw RuntimeError("GradReducer::finish without arm(true) before the step's last backward");
    armed_ = false;
    // What backward did not reach (its gradient is either from an earlier micro-batch of the window, or none):
    // final now, in parameter order, the same on every rank.
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) {
        ready_[i] = 1;
        --missing_[bucket_of_[i]];
      }
    launch_ready();
  }
  at::NoGradGuard no_grad;
  const double world = static_cast<double>(group_.world());
  for (std::size_t k = 0; k < spans_.size(); ++k) {
    const std::size_t b = spans_.size() - 1 - k;
    works_[b]->wait();
    works_[b].reset();
    at::Tensor& buf = buffers_[b];
    if (group_.world() > 1) buf.div_(world);  // x / 1 is x: no launch for it in a 1-rank group
    for (std::size_t i = spans_[b].first; i < spans_[b].second; ++i) {
      at::Tensor& p = params_[i];
      at::Tensor mean = buf.narrow(0, offset_[i], p.numel()).view(p.sizes());
      // A view of the bucket when it lives where the parameter does: nothing to copy back, and the next
      // zero_grad drops it before the bucket is written again.
      if (mean.device() == p.device()) p.mutable_grad() = mean;
      else if (p.grad().defined()) p.mutable_grad().copy_(mean);
      else p.mutable_grad() = mean.to(p.device());
    }
  }
}

}  // namespace ax::train
