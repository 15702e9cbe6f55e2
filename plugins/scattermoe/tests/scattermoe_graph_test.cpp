// scattermoe is CUDA-graph safe: forward + backward of a gated, LoRA'd expert projection are captured once
// and replayed. Replays must give bitwise the eager results — also after new inputs AND a new routing are
// copied into the captured tensors, which proves that routing is read on the device and that no value
// was synchronised to the host at capture time (a host sync during capture fails the capture itself).
// Built only with CUDA (plugins/scattermoe/tests/CMakeLists.txt); skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <axengine/ops/moe_experts.hpp>
#include <axengine/plugin.hpp>

namespace {

std::shared_ptr<ax::ops::MoeExperts> load_scattermoe() {
  if (!at::hasCUDA() || at::detail::getCUDAHooks().deviceCount() == 0) return nullptr;
  void* lib = dlopen(AXENGINE_SCATTERMOE_SO, RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process' life
  REQUIRE_MESSAGE(lib != nullptr, dlerror());
  auto fn = reinterpret_cast<ax::PluginRegisterFn*>(dlsym(lib, "axengine_plugin_register"));
  REQUIRE(static_cast<bool>(fn));
  ax::PluginRegistrar reg;
  fn(reg);
  REQUIRE(reg.staged().size() == 2);  // moe.experts, then moe.mlp composed from it
  REQUIRE(reg.staged()[0].op == "moe.experts");
  return std::static_pointer_cast<ax::ops::MoeExperts>(reg.staged()[0].object);
}

constexpr int64_t T = 512, K = 256, N = 384, E = 16, k = 4, r = 8;

// Writes a fresh top-k routing of random logits into the three routing tensors (in place).
void route(ax::ops::MoeRouting& rt) {
  at::Tensor logits = at::randn({T, E}, rt.expert_offsets.options().dtype(at::kFloat));
  logits.select(1, E - 1).fill_(-1e9);  // one expert without tokens
  at::Tensor flat = std::get<1>(logits.topk(k, 1)).reshape({-1});
  auto [sorted, perm] = flat.sort(/*stable=*/true, 0, false);
  rt.sorted_expert_idxs.copy_(sorted);
  rt.sorted_scattered_idxs.copy_(perm);
  rt.expert_offsets.copy_(at::bincount(flat, {}, E).cumsum(0));
}

struct Outs {
  at::Tensor y, dx, da, db, dg;
};

Outs step(ax::ops::MoeExperts& be, const ax::ops::MoeExpertsArgs& a, const at::Tensor& gy) {
  auto res = be.forward(a);
  ax::ops::MoeExpertsBackwardArgs b;
  b.grad_y = gy;
  b.saved = res.saved;
  auto g = be.backward(a, b);
  return {res.y, g.dx, g.dlora_a, g.dlora_b, g.dgates};
}

}  // namespace

TEST_CASE("scattermoe: forward + backward capture into a CUDA graph and replay with new inputs and routing") {
  auto be = load_scattermoe();
  if (!be) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  at::manual_seed(3);
  const auto fo = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const auto lo = at::TensorOptions().dtype(at::kLong).device(at::kCUDA);
  ax::ops::MoeExpertsArgs a;
  a.x = at::randn({T, K}, fo);
  a.routing.sorted_expert_idxs = at::empty({T * k}, lo);
  a.routing.sorted_scattered_idxs = at::empty({T * k}, lo);
  a.routing.expert_offsets = at::empty({E}, lo);
  a.routing.top_k = k;
  route(a.routing);
  a.weight = ax::ops::WeightTensor::dense(at::randn({E, N, K}, fo).mul_(0.05));
  a.layout = ax::ops::ExpertLayout::ENK;
  a.lora_a = at::randn({r * E, K}, fo).mul_(0.05);
  a.lora_b = at::randn({N, r * E}, fo).mul_(0.5);
  a.scaling = 2.0;
  a.gates = at::rand({T, k}, fo);
  a.check_values = false;  // the value checks read the routing on the host: not on a hot path
  at::Tensor gy = at::randn({T, N}, fo);

  // Warm up on a side stream (lazy initialisation must not happen during capture), then capture.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  Outs cap;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    step(*be, a, gy);
    side.synchronize();
    graph.capture_begin();
    cap = step(*be, a, gy);
    graph.capture_end();
  }
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    if (round == 1) {  // new values in the captured input tensors
      a.x.copy_(at::randn({T, K}, fo));
      a.gates.copy_(at::rand({T, k}, fo));
      gy.copy_(at::randn({T, N}, fo));
      route(a.routing);
    }
    graph.replay();
    c10::cuda::device_synchronize();
    Outs eager = step(*be, a, gy);
    CHECK(at::equal(cap.y, eager.y));
    CHECK(at::equal(cap.dx, eager.dx));
    CHECK(at::equal(cap.da, eager.da));
    CHECK(at::equal(cap.db, eager.db));
    CHECK(at::equal(cap.dg, eager.dg));
  }
}
