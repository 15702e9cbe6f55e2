// The nf4 plugin's tests. On every machine: the built plugin loads through the real loader and registers
// what its descriptor declares (dequant and linear.lora kernels, the nf4 quantizer); the chunking rule;
// the entry points refuse CPU tensors. On a CUDA device (else skipped with a message):
//   dequant   bit-exact with ops::dequantize for every blocksize 16..4096, plain and double-quantised,
//             fp32/bf16/fp16, over unaligned ranges, misaligned outputs, selected experts and column blocks
//   quantize  bit-exact with ops::quantize_nf4 on the same device (codes, absmax, nested fields) for every
//             blocksize, fp32/bf16/fp16/fp64 inputs, a partial trailing nested block, an all-zero block and
//             values exactly on the midpoints between two codes (ties go to the lower code)
//   linear    forward / backward with chunks forced small agree with core's aten linear.lora and repeat
//             bitwise; one chunk or many give the same y (each output is the same whole-K dot product)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <axengine/builtins.hpp>
#include <axengine/error.hpp>
#include <axengine/ops/linear_lora.hpp>
#include <axengine/ops/quant.hpp>
#include <axengine/plugin_loader.hpp>
#include <axengine/registry.hpp>
#include <string>

#include "linear.hpp"
#include "nf4.hpp"

namespace {

using ax::ops::WeightTensor;

bool have_cuda() { return at::hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0; }
#define NF4_NEEDS_CUDA()                                   \
  if (!have_cuda()) {                                      \
    MESSAGE("skipped: needs a CUDA device (no CUDA device present)"); \
    return;                                                \
  }

const at::Device kCuda(at::kCUDA, 0);

// Bit-for-bit equality (NaN payloads and signed zeros included): the raw bytes.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous().view(at::kByte), y = b.contiguous().view(at::kByte);
  return at::equal(x.cpu(), y.cpu());
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor o = out.to(at::kCPU, at::kDouble), r = ref.to(at::kCPU, at::kDouble);
  if (!o.isfinite().all().item<bool>()) return 1e30;
  return (o - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
}

// Random weight with outliers (absmax varies by block) and one all-zero block.
at::Tensor weight_values(std::vector<int64_t> shape, int64_t blocksize, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor w = at::randn(shape, g, at::kFloat);
  at::Tensor flat = w.view(-1);
  flat.narrow(0, 0, std::min<int64_t>(flat.numel(), 7)).mul_(9.0);
  if (flat.numel() >= 2 * blocksize) flat.narrow(0, blocksize, blocksize).zero_();
  return w;
}

const int64_t kBlocksizes[] = {16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
const at::ScalarType kOutTypes[] = {at::kFloat, at::kBFloat16, at::kHalf};

}  // namespace

TEST_CASE("nf4 plugin: loads and registers dequant, linear.lora and the nf4 quantizer as declared") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const ax::PluginReport& r = loader.load_file(AXENGINE_NF4_SO, "command line");
  INFO(r.reason);
  REQUIRE(r.status == ax::PluginReport::Status::loaded);
  CHECK(r.name == "nf4");
  const ax::Provider* dq = registry.find(ax::ProviderKind::kernel, "dequant", "nf4");
  const ax::Provider* ll = registry.find(ax::ProviderKind::kernel, "linear.lora", "nf4");
  const ax::Provider* qz = registry.find(ax::ProviderKind::quantizer, "", "nf4");
  REQUIRE(dq != nullptr);
  REQUIRE(ll != nullptr);
  REQUIRE(qz != nullptr);
  for (const ax::Provider* p : {dq, ll, qz}) {
    CHECK(p->info.needs.formats == std::vector<std::string>{"nf4"});
    CHECK(p->info.needs.devices == std::vector<std::string>{"cuda"});
    CHECK(p->object != nullptr);
  }
  CHECK(dq->info.needs.dtypes == std::vector<std::string>{"fp32", "bf16", "fp16"});
  CHECK(ll->info.needs.dtypes == std::vector<std::string>{"bf16", "fp16"});
  CHECK(r.providers.size() == 3);
}

TEST_CASE("nf4: chunks are 8 Mi elements, whole multiples of 128 rows or columns, within the dimension") {
  using ax::nf4::chunk_extent;
  CHECK(chunk_extent(4096, 4096, ax::nf4::kChunkElems) == 2048);
  CHECK(chunk_extent(12288, 4096, ax::nf4::kChunkElems) == 2048);
  CHECK(chunk_extent(4096, 12288, ax::nf4::kChunkElems) == 640);    // 682 rounded down to 128s
  CHECK(chunk_extent(100, 64, ax::nf4::kChunkElems) == 100);        // the whole dimension
  CHECK(chunk_extent(1000, 1 << 24, ax::nf4::kChunkElems) == 128);  // never below 128
}

TEST_CASE("nf4: the entry points refuse CPU tensors with a usage error") {
  const WeightTensor w = ax::ops::quantize_nf4(weight_values({8, 64}, 64, 1), 64, false);
  CHECK_THROWS_AS(ax::nf4::dequantize_range(w, 0, at::empty({512}, at::kFloat)), ax::UsageError);
  CHECK_THROWS_AS(ax::nf4::quantize(at::ones({8, 64}), 64, false), ax::UsageError);
  ax::ops::LinearLoraArgs a;
  a.x = at::ones({2, 64}, at::kBFloat16);
  a.weight = w;
  CHECK_THROWS_AS(ax::nf4::linear_forward(a), ax::UsageError);
}

TEST_CASE("nf4 dequant (CUDA): bit-exact with ops::dequantize, every blocksize, plain and double quant") {
  NF4_NEEDS_CUDA();
  for (int64_t bs : kBlocksizes) {
    // 845 blocks: not a multiple of 256, so double quant has a partial trailing nested block.
    const at::Tensor v = weight_values({5, 169 * bs}, bs, 100 + bs).to(kCuda);
    for (bool dq : {false, true}) {
      const WeightTensor w = ax::ops::quantize_nf4(v, bs, dq);
      const int64_t n = w.numel();
      for (at::ScalarType dt : kOutTypes) {
        CAPTURE(bs);
        CAPTURE(dq);
        CAPTURE(dt);
        const at::Tensor ref = ax::ops::dequantize(w, dt).reshape(-1);
        // whole, unaligned heads and tails, single elements, a range ending at the last element
        const std::pair<int64_t, int64_t> ranges[] = {{0, n}, {1, 37}, {3, 1000}, {17, n - 22}, {n - 9, 9},
                                                      {bs, 2 * bs}, {5, 1}, {n - 1, 1}, {16 * 7, 16 * 9 + 3}};
        for (auto [start, count] : ranges) {
          CAPTURE(start);
          const at::Tensor out = at::empty({count}, v.options().dtype(dt));
          ax::nf4::dequantize_range(w, start, out);
          CHECK(same_bits(out, ref.narrow(0, start, count)));
        }
        // an output one element past a 16-byte boundary: the element-by-element path
        const at::Tensor buf = at::empty({n + 1}, v.options().dtype(dt));
        const at::Tensor shifted = buf.narrow(0, 1, n);
        ax::nf4::dequantize_range(w, 0, shifted);
        CHECK(same_bits(shifted, ref));
      }
    }
  }
}

TEST_CASE("nf4 dequant (CUDA): selected experts and column blocks are bit-exact") {
  NF4_NEEDS_CUDA();
  for (bool dq : {false, true}) {
    const WeightTensor w = ax::ops::quantize_nf4(weight_values({6, 40, 96}, 64, 7).to(kCuda), 64, dq);
    const at::Tensor ids = at::tensor(std::vector<int64_t>{5, 0, 3, 5}, at::kLong).to(kCuda);
    for (at::ScalarType dt : kOutTypes) {
      const at::Tensor out = at::empty({4, 40, 96}, ids.options().dtype(dt));
      ax::nf4::dequantize_experts(w, ids, out);
      CHECK(same_bits(out, ax::ops::dequantize(w, dt, ids)));
    }
  }
  // Columns of [N, K], K a multiple of 16 (vector path) and not (element path).
  for (int64_t K : {int64_t{192}, int64_t{200}}) {
    for (bool dq : {false, true}) {
      const WeightTensor w = ax::ops::quantize_nf4(weight_values({48, K}, 16, 9).to(kCuda), 16, dq);
      const at::Tensor ref = ax::ops::dequantize(w, at::kBFloat16);
      for (auto [k0, kc] : {std::pair<int64_t, int64_t>{0, K}, {64, 64}, {16, 128}, {3, 50}, {K - 8, 8}}) {
        CAPTURE(K);
        CAPTURE(k0);
        const at::Tensor out = at::empty({48, kc}, ref.options());
        ax::nf4::dequantize_columns(w, k0, out);
        CHECK(same_bits(out, ref.narrow(1, k0, kc).contiguous()));
      }
    }
  }
}

TEST_CASE("nf4 quantize (CUDA): bit-exact with ops::quantize_nf4 on the same device") {
  NF4_NEEDS_CUDA();
  const std::array<float, 16>& t = ax::ops::nf4_values();
  for (int64_t bs : kBlocksizes) {
    at::Tensor v = weight_values({5, 169 * bs}, bs, 300 + bs);
    // Block 2: absmax exactly 1 and every midpoint between two codes (a tie: the lower code wins), and
    // the values one ulp either side.
    at::Tensor b2 = v.view(-1).narrow(0, 2 * bs, bs);
    b2.zero_();
    b2[0] = 1.0f;
    for (int i = 0; i < 15 && 1 + 3 * i + 2 < bs; ++i) {
      const float mid = (t[i] + t[i + 1]) / 2.0f;
      b2[1 + 3 * i] = mid;
      b2[2 + 3 * i] = std::nextafter(mid, -2.0f);
      b2[3 + 3 * i] = std::nextafter(mid, 2.0f);
    }
    v = v.to(kCuda);
    for (at::ScalarType in : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
      for (bool dq : {false, true}) {
        CAPTURE(bs);
        CAPTURE(in);
        CAPTURE(dq);
        const at::Tensor x = v.to(in);
        const WeightTensor ours = ax::nf4::quantize(x, bs, dq), ref = ax::ops::quantize_nf4(x, bs, dq);
        CHECK(ours.shape == ref.shape);
        CHECK(ours.blocksize == ref.blocksize);
        CHECK(same_bits(ours.codes, ref.codes));
        CHECK(same_bits(ours.scales, ref.scales));
        CHECK(ours.double_quant() == ref.double_quant());
        if (dq) {
          CHECK(same_bits(ours.nested_scales, ref.nested_scales));
          CHECK(same_bits(ours.nested_code, ref.nested_code));
          CHECK(ours.nested_offset == ref.nested_offset);
          CHECK(ours.nested_blocksize == ref.nested_blocksize);
        }
      }
    }
  }
}

TEST_CASE("nf4 linear.lora (CUDA): chunked forward/backward agree with the aten backend and repeat bitwise") {
  NF4_NEEDS_CUDA();
  ax::Registry registry;
  ax::register_builtins(registry);
  const auto aten = registry.kernel<ax::ops::LinearLora>("aten");
  REQUIRE(aten != nullptr);
  const int64_t K = 192, N = 320, r = 4;  // x [3, 11, K]: 33 rows
  at::Generator g = at::detail::createCPUGenerator(11);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    for (bool dq : {false, true}) {
      CAPTURE(dt);
      CAPTURE(dq);
      const auto o = at::TensorOptions().dtype(dt).device(kCuda);
      ax::ops::LinearLoraArgs a;
      a.weight = ax::ops::quantize_nf4(weight_values({N, K}, 64, 12).to(kCuda) / 8.0, 64, dq);
      a.x = at::randn({3, 11, K}, g, at::kFloat).to(o);
      a.bias = at::randn({N}, g, at::kFloat).to(o);
      a.lora_a = (at::randn({r, K}, g, at::kFloat) / 8.0).to(o);
      a.lora_b = (at::randn({N, r}, g, at::kFloat) / 8.0).to(o);
      a.scaling = 2.0;
      ax::ops::LinearLoraBackwardArgs b;
      b.grad_y = at::randn({3, 11, N}, g, at::kFloat).to(o);
      // 128 rows of K (3 chunks forward, the last short), 128 columns of N (2 chunks backward, the last short)
      const int64_t small = 128 * K;
      const at::Tensor y = ax::nf4::linear_forward_chunked(a, small);
      const at::Tensor y1 = ax::nf4::linear_forward_chunked(a, int64_t{1} << 40);
      const at::Tensor y_ref = aten->forward(a);
      CHECK(y.sizes() == y_ref.sizes());
      CHECK(rel_err(y, y_ref) < 1e-2);
      CHECK(rel_err(y, y1) < 1e-2);
      CHECK(same_bits(y, ax::nf4::linear_forward_chunked(a, small)));
      const ax::ops::LinearLoraGrads gr = ax::nf4::linear_backward_chunked(a, b, small);
      const ax::ops::LinearLoraGrads gr_ref = aten->backward(a, b);
      CHECK(rel_err(gr.dx, gr_ref.dx) < 1e-2);
      CHECK(rel_err(gr.dlora_a, gr_ref.dlora_a) < 1e-2);
      CHECK(rel_err(gr.dlora_b, gr_ref.dlora_b) < 1e-2);
      const ax::ops::LinearLoraGrads again = ax::nf4::linear_backward_chunked(a, b, small);
      CHECK(same_bits(gr.dx, again.dx));
      CHECK(same_bits(gr.dlora_a, again.dlora_a));
      CHECK(same_bits(gr.dlora_b, again.dlora_b));
      // preallocated outputs are written in place
      ax::ops::LinearLoraArgs ao = a;
      ao.out = at::empty({3, 11, N}, o);
      CHECK(ax::nf4::linear_forward_chunked(ao, small).is_same(ao.out));
      CHECK(same_bits(ao.out, y));
    }
  }
}
