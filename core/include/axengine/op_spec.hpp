// Ops are registered data. An OpSpec is everything the engine knows about one kernel op: its id and
// [kernels] config key, the dtype / weight-format / layout space a backend may claim, the tolerance row the
// conformance suite judges backends by, the `reference` backend, and the conformance problem generator.
//
// Core registers its eleven ops (moe.experts, dequant, norm_rope, attention, linear.lora, rms_norm, swiglu,
// linear_ce, moe.mlp, linear_attention, causal_conv1d) as OpSpecs through the same PluginRegistrar::op a plugin uses, so a plugin can define a NEW op —
// its interface (a class deriving from ax::KernelBackend with `static constexpr const char* kOp`), its
// reference backend and its conformance problems — and other backends of it are selected, explained and certified like core's.
// docs/ops/defining-an-op.md walks through one.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "axengine/kernel_op.hpp"

namespace ax {

namespace conformance {
class Suite;
}

// Norm-relative tolerances ||got - want||_2 / ||want||_2 for one compute dtype (docs/ops/README.md,
// "Tolerance policy"): forward outputs and gradients.
struct OpTolerance {
  std::string dtype;  // "fp32", "bf16", "fp16"
  double forward = 0;
  double backward = 0;
};

struct OpSpec {
  std::string id;          // "moe.experts": backends register under it, case names start with it
  std::string config_key;  // the key under [kernels] ("moe"); letters, digits and '_'
  std::string summary;

  // The space a backend's Requirements may claim; a backend claiming nothing on an axis claims all of it.
  // The reference backend covers the whole space. Empty formats / layouts: the op has no such axis.
  std::vector<std::string> dtypes;   // compute dtypes ("fp32", "bf16", "fp16")
  std::vector<std::string> formats;  // weight formats the op reads ("dense", "nf4", ...); selection asks
                                     // with the run's model.weight_format when non-empty
  std::vector<std::string> layouts;  // op-specific layouts ("EKN", "ENK")

  // One row per dtype in `dtypes`: what the conformance suite holds every backend to.
  std::vector<OpTolerance> tolerances;

  // The `reference` backend, an object of the op's interface type (PluginRegistrar::op sets it). The
  // registry registers it as the kernel provider (id, "reference") covering the whole space.
  std::shared_ptr<void> reference;
  std::string reference_summary;

  // The conformance problem generator: called once per backend under test and device, it states the op's
  // problems and hands them to the suite's generic checks (axengine/op_conformance.hpp).
  std::function<void(conformance::Suite&)> conformance;

  // The row for `dtype`; throws UsageError naming the op when there is none.
  const OpTolerance& tolerance(const std::string& dtype) const;
};

}  // namespace ax
