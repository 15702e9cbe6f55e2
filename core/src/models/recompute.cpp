#include "models/recompute.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "axengine/error.hpp"
#include "models/offload.hpp"

namespace ax::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The generators fn may draw from: the CPU one, and the CUDA one of x's device.
struct RngStates {
  at::Tensor cpu, cuda;
  c10::Device device{at::kCPU};

  static RngStates capture(const at::Tensor& x) {
    RngStates s;
    s.cpu = at::detail::getDefaultCPUGenerator().get_state();
    if (x.is_cuda()) {
      s.device = x.device();
      s.cuda = at::globalContext().defaultGenerator(s.device).get_state();
    }
    return s;
  }
  void restore() const {
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    cpu_gen.set_state(cpu);
    if (cuda.defined()) {
      at::Generator g = at::globalContext().defaultGenerator(device);
      g.set_state(cuda);
    }
  }
};

struct State : torch::CustomClassHolder {
  RecomputeFn fn;
  RngStates rng;
  bool x_requires_grad = false;
  bool offloadable = true;
  std::shared_ptr<OffloadedInput> offloaded;  // x in host memory ([train] activation_offload), else saved as is
};

struct RecomputeNode : torch::autograd::Function<RecomputeNode> {
  // `anchor` requires grad so that the node exists even when x does not (the first layer's input is a
  // frozen embedding, yet its LoRA factors need gradients).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                               c10::intrusive_ptr<State> st) {
    (void)anchor;
    st->rng = RngStates::capture(x);
    st->x_requires_grad = x.requires_grad();
    // Offloaded before fn is queued, so that the copy out overlaps fn's compute.
    if (st->offloadable && offloads(checkpoint_store(), x)) st->offloaded = OffloadedInput::stash(x.detach());
    variable_list out = st->fn(x.detach());
    for (const auto& t : out)
      if (!t.defined()) throw RuntimeError("recompute: the function returned an undefined tensor");
    if (!st->offloaded) ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    const at::Tensor x0 = st->offloaded ? st->offloaded->take() : ctx->get_saved_variables()[0];
    at::Tensor x = x0.detach().requires_grad_(st->x_requires_grad);
    variable_list outs;
    {
      RngStates now = RngStates::capture(x0);  // fn's draws must not shift the stream the rest of backward sees
      st->rng.restore();
      at::AutoGradMode grad_on(true);
      outs = st->fn(x);
      now.restore();
    }
    variable_list roots, seeds;
    for (std::size_t i = 0; i < outs.size() && i < grads.size(); ++i)
      if (grads[i].defined() && outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        seeds.push_back(grads[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, seeds);
    return {st->x_requires_grad ? x.grad() : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> recompute(RecomputeFn fn, const at::Tensor& x, bool offloadable) {
  static const at::Tensor anchor = at::empty({0}).requires_grad_(true);
  auto st = c10::make_intrusive<State>();
  st->fn = std::move(fn);
  st->offloadable = offloadable;
  return RecomputeNode::apply(x, anchor, st);
}

}  // namespace ax::autograd
