// The reference backends as the engine finds them: registered as built-ins for every known op, with the
// requirements selection checks (cpu + cuda, fp32/bf16/fp16, their formats and layouts).
#include <doctest/doctest.h>

#include "axengine/builtins.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/selection.hpp"
#include "ops/reference/register.hpp"

using namespace ax;

TEST_CASE("reference backends: one per known op, builtin origin, selected for every claimed query") {
  Registry reg;
  register_builtins(reg);
  for (const auto& op : known_ops()) {
    CAPTURE(op.id);
    const Provider* p = reg.find(ProviderKind::kernel, op.id, "reference");
    REQUIRE(p);
    CHECK(p->info.plugin == "builtin");
    CHECK(p->info.origin == "builtin");
    CHECK(p->object);
  }
  KernelPreferences prefs;
  prefs.strict = true;
  prefs.prefer["moe.experts"] = {"reference"};
  DeviceInfo cuda;
  cuda.type = DeviceInfo::Type::cuda;
  cuda.arch = 90;
  for (const DeviceInfo& dev : {DeviceInfo{}, cuda})
    for (std::string fmt : {"dense", "nf4", "mxfp4", "nvfp4", "fp8"})
      for (std::string layout : {"EKN", "ENK"}) {
        Resolution r = resolve_backend(reg, prefs, "moe.experts", KernelQuery{dev, "bf16", fmt, layout});
        CHECK(r.chosen == "reference");
      }
  // linear.lora is not listed: bf16 goes to core's production `aten`, fp32 to the reference (packed weights
  // are dequantised inside the call by both)
  for (std::string fmt : {"dense", "nf4", "mxfp4", "nvfp4", "fp8"}) {
    CHECK(resolve_backend(reg, prefs, "linear.lora", KernelQuery{DeviceInfo{}, "bf16", fmt, ""}).chosen == "aten");
    CHECK(resolve_backend(reg, prefs, "linear.lora", KernelQuery{DeviceInfo{}, "fp32", fmt, ""}).chosen == "reference");
  }
  prefs.prefer["dequant"] = {"reference"};
  Resolution no = resolve_backend(reg, prefs, "dequant", KernelQuery{DeviceInfo{}, "bf16", "dense", ""});
  CHECK(no.chosen.empty());  // strict: a dense weight has nothing to dequantise, and nothing else is listed
  // registering twice is refused: the names are taken
  CHECK_THROWS_AS(ops::register_reference_kernels(reg), UsageError);
  CHECK(reg.kernel<ops::MoeExperts>("reference"));
}
