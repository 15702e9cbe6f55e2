// Dynamic loss scaling for fp16 training, as torch.amp.GradScaler does it, with its defaults and its ATen kernels:
// each micro-batch's backward runs on loss · scale, so gradients too small for fp16 (below ~6e-8) survive the
// fp16 parts of backward; then the gradients are multiplied by 1/scale (computed in fp64, rounded to fp32) and
// checked for inf/NaN (_amp_foreach_non_finite_check_and_unscale_), clipping and the gradient norm see the true
// gradients, a step whose gradients are not finite is skipped (the optimizer leaves parameters, moments and its
// step count as they were), and _amp_update_scale_ multiplies the scale by backoff_factor after a skipped step
// and by growth_factor after growth_interval finite steps in a row.
//
// The state is two device tensors updated in place (scale: float32, growth_tracker: int32) and every operation a
// device op: nothing waits for the device, and a CUDA graph that captures the step (plugins/compile) replays the
// scaler too. The trainer (train/trainer.cpp) uses it whenever the compute dtype is fp16 (run.cpp); its state
// goes into trainer_state.json ("loss_scale") and comes back bitwise on resume.
#pragma once
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "train/trainer_state.hpp"  // LossScaleState: what a checkpoint holds of it

namespace ax::train {

// torch.amp.GradScaler's constructor defaults (HF Trainer and accelerate use them as they are).
struct LossScaleOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  LossScaler(const LossScaleOptions& options, at::Device device);

  // loss · scale: what backward runs on (GradScaler.scale).
  at::Tensor scale(const at::Tensor& loss) const;
  // Multiplies `grads` by 1/scale in place and returns this step's "not finite" flag: a float32 scalar on the
  // device, 1 when any gradient held an inf or a NaN (GradScaler.unscale_).
  at::Tensor unscale(const std::vector<at::Tensor>& grads) const;
  // After the optimizer step (skipped when `found_inf` is 1): back off or grow (GradScaler.update).
  void update(const at::Tensor& found_inf);

  // The scale the next backward uses: float32 scalar on the device.
  const at::Tensor& scale_tensor() const { return scale_; }
  const LossScaleOptions& options() const { return options_; }
  // Read back (a sync; checkpoints sync anyway) / written in place (the tensors a captured graph reads stay).
  LossScaleState state() const;
  void load(const LossScaleState& state);

 private:
  LossScaleOptions options_;
  at::Tensor scale_;           // float32 []
  at::Tensor growth_tracker_;  // int32 []: finite steps in a row since the last change of the scale
};

}  // namespace ax::train
