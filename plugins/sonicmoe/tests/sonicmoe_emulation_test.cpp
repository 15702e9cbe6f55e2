// The sonicmoe block's ATen orchestration (src/block.cpp: LoRA padding and its thin products, the weight
// orientations each GEMM is handed, the combine, dgates from the dGLU rowsum, the four LoRA gradients) on
// the CPU, with the kernels replaced by a host emulation of their contract (gather_gemm_emulation.cpp).
// It runs the whole moe.mlp conformance grid (bf16, dense, both layouts) against the reference: what this
// cannot see is the kernels themselves, which the CUDA case of sonicmoe_test.cpp covers on Hopper.
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <string>

#include <axengine/builtins.hpp>
#include <axengine/conformance.hpp>
#include <axengine/registry.hpp>

#include "../src/sonicmoe.hpp"

TEST_CASE("sonicmoe (kernels emulated on the host) passes the moe.mlp conformance grid on the CPU") {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::Provider p;
  p.info.kind = ax::ProviderKind::kernel;
  p.info.op = ax::ops::MoeMlp::kOp;
  p.info.name = "sonicmoe_emulated";
  p.info.plugin = "test";
  p.info.needs = {{"cpu"}, 0, 0, {"bf16"}, {"dense"}, {"EKN", "ENK"}};
  p.object = ax::sonicmoe::make_backend();
  registry.add(std::move(p));
  ax::conformance::Options o;
  o.op = "moe.mlp";
  o.backend = "sonicmoe_emulated";
  o.device = "cpu";
  o.quick = false;
  ax::conformance::Report rep = ax::conformance::run(registry, o);
  std::string fails;
  int aligned_pass = 0;
  for (const auto& c : rep.cases) {
    if (c.status == ax::conformance::Status::fail) fails += "\n  " + c.name + ": " + c.message;
    const bool aligned = c.name.find("H=64,") != std::string::npos || c.name.find("H=128,") != std::string::npos;
    if (aligned && c.status == ax::conformance::Status::pass) ++aligned_pass;
    if (aligned && c.status == ax::conformance::Status::skip) fails += "\n  (skipped) " + c.name + ": " + c.message;
  }
  INFO("failing cases:" << fails);
  CHECK(fails.empty());
  CHECK(aligned_pass >= 60);  // 3 aligned shapes x 6 variants x fwd/bwd x 2 layouts, + determinism
}
