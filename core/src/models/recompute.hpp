// Activation checkpointing ("recompute"): run a piece of the model without keeping its activations and
// run it again in backward. Used per decoder layer when [train] activation_checkpointing is on.
#pragma once
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax::autograd {

// fn(x) -> outputs (outputs[0] the layer's result; more outputs, e.g. router logits, may follow).
using RecomputeFn = std::function<std::vector<at::Tensor>(const at::Tensor& x)>;

// Calls fn(x) with autograd off and returns its outputs attached to one autograd node. In backward the
// node re-runs fn on x with autograd on and with the CPU and CUDA RNG states of the first run (LoRA
// dropout draws the same masks), back-propagates the incoming gradients through it — parameters captured
// by fn (LoRA factors) accumulate their .grad there — and passes dx on. `fn` must own what it captures:
// it runs again after the caller has returned. Undefined outputs are not allowed.
// x is kept for backward where checkpoint_store() says when forward runs (models/offload.hpp): as is, or in
// host memory ([train] activation_offload), brought back (prefetched by the layer above) before backward.
// `offloadable` = false: x stays where it is whatever the store (the token shards of a tiled MLP inside a layer).
std::vector<at::Tensor> recompute(RecomputeFn fn, const at::Tensor& x, bool offloadable = true);

}  // namespace ax::autograd
