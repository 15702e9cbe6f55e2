// The step runner (registry kind "executor"): how one optimizer step of the trainer is run on the device.
// The trainer owns what a step computes (a StepProgram: forward and backward of every micro-batch, clipping,
// the optimizer step); an executor owns how it is run. Core's "eager" executor runs the program as is; a
// plugin's executor may run it differently, e.g. capture it once in a CUDA graph and replay it
// (plugins/compile). An executor that cannot run a step its way runs it eagerly and says why, once.
//
// Selection (select_executor): the plugins' executor providers are asked in registration order; the first
// that returns an executor for the run is used, else core's eager one. A provider returns nullptr when its
// configuration does not ask for it (e.g. [compile] enabled = false).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/device.hpp"
#include "axengine/model.hpp"
#include "axengine/registry.hpp"
#include "axengine/selection.hpp"

namespace ax {

// One optimizer step, as the trainer defines it.
class StepProgram {
 public:
  virtual ~StepProgram() = default;
  // Enqueues the step on `batches` (one per micro-batch; on the host or already on the device) without
  // waiting for the device, and returns its statistics as a tensor on the device (double [micro-batches + 2]:
  // the losses, the gradient norm, the "not finite" flag; fp16 runs append the loss scaler's "step skipped"
  // flag and the scale the step ran with). The learning rate is `lr`, or, when `lr_device`
  // is defined, the device scalar it holds: nothing of the step is then read on the host, so the step can
  // be captured and replayed with a new rate.
  virtual at::Tensor run(const std::vector<Batch>& batches, double lr, const at::Tensor& lr_device) = 0;
  // Whether run() takes `lr_device` (the optimizer steps with a learning rate on the device).
  virtual bool device_lr() const = 0;
  // Drops what a run() that did not complete left behind (a capture that failed midway: gradients that
  // were allocated but never computed), so that the step can be run again.
  virtual void abandon() = 0;
};

// What an executor provider knows of the run when it is asked.
struct ExecutorContext {
  DeviceInfo device;
  const Registry* registry = nullptr;
  // The kernel backends the model selected so far (resolved lazily: complete after the first step).
  std::function<std::vector<Resolution>()> resolutions;
  int64_t micro_batches = 1;  // per step (grad_accum)
  int64_t rows = 1;           // rows per micro-batch
  int64_t sequence_len = 0;   // tokens per row
  int64_t span_capacity = 0;  // the most cu_seqlens spans a micro-batch of this run's data has
  bool packed = false;        // rows hold several samples: cu_seqlens' length varies from batch to batch
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual std::string name() const = 0;
  // True: the batcher pads every micro-batch to identical shapes (cu_seqlens to ExecutorContext::span_capacity
  // spans, empty ones at the end; max_seqlen to the row length), so that every step has one shape signature.
  virtual bool static_shapes() const { return false; }
  // Runs one step of `program` on the host micro-batches `batches` with learning rate `lr`; returns the
  // program's statistics tensor (on the device), valid until the next call.
  virtual at::Tensor step(StepProgram& program, const std::vector<Batch>& batches, double lr) = 0;
  // Why steps run eagerly after all, when they do ("" otherwise): for the run's log and tests.
  virtual std::string fallback_reason() const { return ""; }
};

class ExecutorProvider {
 public:
  virtual ~ExecutorProvider() = default;
  // The executor for this run, or nullptr when the provider's configuration does not ask for it.
  virtual std::unique_ptr<StepExecutor> create(const ExecutorContext& context) const = 0;
};

// Runs the program as it is (the default; also what other executors fall back to).
class EagerExecutor final : public StepExecutor {
 public:
  std::string name() const override { return "eager"; }
  at::Tensor step(StepProgram& program, const std::vector<Batch>& batches, double lr) override {
    return program.run(batches, lr, at::Tensor());
  }
};

// The first plugin executor that wants the run, else the eager one. Throws UsageError when two plugins'
// executors both want it (which one would run is not the user's to guess).
std::unique_ptr<StepExecutor> select_executor(const Registry& registry, const ExecutorContext& context);

}  // namespace ax
