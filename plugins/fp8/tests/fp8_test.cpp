// The fp8 plugin's tests. On every machine: the built plugin loads through the real loader and registers the
// dequant kernel its descriptor declares. On a CUDA device (else skipped with a message): the kernel is bit-exact
// with ops::dequantize (fp32 / bf16 / fp16) on 128 x 128 and ragged 8 x 16 / 7 x 5 blocks, rows whose length is
// and is not a multiple of 8 (the vector and the element paths), a misaligned output, and selected experts.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <doctest/doctest.h>

#include <axengine/builtins.hpp>
#include <axengine/ops/dequant.hpp>
#include <axengine/ops/fp8.hpp>
#include <axengine/ops/quant.hpp>
#include <axengine/plugin_loader.hpp>
#include <axengine/registry.hpp>

#include "fp8_plugin.hpp"

namespace {

bool have_cuda() { return at::hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0; }

// Bit-for-bit equality: the raw bytes.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  return at::equal(a.contiguous().view(at::kByte).cpu(), b.contiguous().view(at::kByte).cpu());
}

ax::ops::WeightTensor weight(std::vector<int64_t> shape, int64_t br, int64_t bc, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor w = at::randn(shape, g, at::kFloat);
  w.view(-1).narrow(0, 0, std::min<int64_t>(w.numel(), 5)).mul_(50.0);  // outliers: the scales differ by block
  return ax::ops::quantize_fp8_blocks(w, br, bc).to(at::Device(at::kCUDA, 0));
}

}  // namespace

TEST_CASE("fp8 plugin: loads and registers the fp8 dequant kernel as declared") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const ax::PluginReport& r = loader.load_file(AXENGINE_FP8_SO, "command line");
  INFO(r.reason);
  REQUIRE(r.status == ax::PluginReport::Status::loaded);
  const ax::Provider* dq = registry.find(ax::ProviderKind::kernel, "dequant", "fp8");
  REQUIRE(dq != nullptr);
  CHECK(dq->info.needs.formats == std::vector<std::string>{"fp8"});
  CHECK(dq->info.graph_safe);
}

TEST_CASE("fp8 plugin: the kernel equals ops::dequantize bit for bit, whole and selective") {
  if (!have_cuda()) {
    MESSAGE("skipped: needs a CUDA device (no CUDA device present)");
    return;
  }
  auto be = ax::fp8::make_dequant();
  struct Case {
    std::vector<int64_t> shape;
    int64_t br, bc;
  };
  for (const Case& c : {Case{{256, 384}, 128, 128}, Case{{4, 576, 256}, 128, 128}, Case{{3, 20, 40}, 8, 16},
                        Case{{5, 17, 33}, 8, 16}, Case{{2, 24, 64}, 7, 5}, Case{{1, 1, 8}, 128, 128}}) {
    CAPTURE(c.shape.size());
    CAPTURE(c.shape.back());
    const ax::ops::WeightTensor w = weight(c.shape, c.br, c.bc, 3);
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      CAPTURE(dt);
      ax::ops::DequantArgs a;
      a.weight = w;
      a.dtype = dt;
      CHECK(same_bits(be->dequantize(a), ax::ops::dequantize(w, dt)));
      // A misaligned output (one element in): the element path.
      at::Tensor buf = at::empty({w.numel() + 1}, w.codes.options().dtype(dt));
      a.out = buf.narrow(0, 1, w.numel()).view(c.shape);
      CHECK(same_bits(be->dequantize(a), ax::ops::dequantize(w, dt)));
      if (c.shape.size() == 3) {
        a.out = at::Tensor();
        a.experts = at::tensor(std::vector<int64_t>{c.shape[0] - 1, 0, c.shape[0] - 1}, at::kLong).to(w.codes.device());
        CHECK(same_bits(be->dequantize(a), ax::ops::dequantize(w, dt, a.experts)));
      }
    }
  }
}
