// The weight formats against their peers (goldens from scripts/goldens/make_quant_goldens.py:
// bitsandbytes for nf4, torchao for mxfp4/nvfp4), plus axis, selective and validation behaviour.
#include <doctest/doctest.h>

#include "axengine/ops/dequant.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/registry.hpp"
#include "ops/reference/register.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {
at::Tensor values_tensor(const std::array<float, 16>& v) { return at::tensor(at::ArrayRef<float>(v.data(), 16)); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("nibble packing order: nf4 puts the first element high, mxfp4/nvfp4 low") {
  at::Tensor c = at::tensor({1, 2, 15, 0}, at::kByte);
  CHECK(at::equal(pack_nibbles(c, true), at::tensor({0x12, 0xF0}, at::kByte)));
  CHECK(at::equal(pack_nibbles(c, false), at::tensor({0x21, 0x0F}, at::kByte)));
  CHECK(at::equal(unpack_nibbles(pack_nibbles(c, true), true), c));
  CHECK(at::equal(unpack_nibbles(pack_nibbles(c, false), false), c));
}

TEST_CASE("e2m1 encode rounds to nearest even and saturates; e8m0 and e4m3 decode") {
  at::Tensor x = at::tensor({0.0f, 0.25f, 0.26f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 5.5f, 100.0f, -0.1f, -6.0f});
  at::Tensor want = at::tensor({0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 8, 15}, at::kByte);
  CHECK(at::equal(e2m1_encode(x), want));
  CHECK(at::equal(e2m1_decode(at::arange(16, at::kByte)), values_tensor(e2m1_values())));
  at::Tensor s = at::tensor({0, 1, 126, 127, 128, 254}, at::kByte);
  at::Tensor d = e8m0_decode(s);
  CHECK(d[0].item<float>() == std::ldexp(1.0f, -127));
  CHECK(d[1].item<float>() == std::ldexp(1.0f, -126));
  CHECK(d[3].item<float>() == 1.0f);
  CHECK(d[5].item<float>() == std::ldexp(1.0f, 127));
  CHECK(std::isnan(e8m0_decode(at::tensor({255}, at::kByte))[0].item<float>()));
  // e4m3: 0x38 = 1.0, 0x7E = 448, 0x01 = 2^-9 (smallest subnormal)
  at::Tensor e = e4m3_decode(at::tensor({0x38, 0x7E, 0x01}, at::kByte));
  CHECK(e[0].item<float>() == 1.0f);
  CHECK(e[1].item<float>() == 448.0f);
  CHECK(e[2].item<float>() == std::ldexp(1.0f, -9));
}

TEST_CASE("nf4 matches bitsandbytes bit for bit (codes, absmax, dequant; fp32 and bf16 input)") {
  auto g = test::load_safetensors(test::data_path("quant/nf4.safetensors"));
  CHECK(at::equal(values_tensor(nf4_values()), g["nf4_table"]));
  CHECK(at::equal(bnb_dynamic_map(), g["dynamic_map"]));
  for (std::string name : {"fp32", "bf16"}) {
    CAPTURE(name);
    at::Tensor input = g[name + "_input"];
    WeightTensor w = quantize_nf4(input, 64, false);
    CHECK(at::equal(w.codes.reshape(-1), g[name + "_codes"]));
    CHECK(at::equal(w.scales, g[name + "_absmax"]));
    // bitsandbytes dequantises to the input's dtype (fp32 math, rounded once)
    const auto dt = input.scalar_type();
    CHECK(at::equal(dequantize(w, dt).to(at::kFloat), g[name + "_dequant"]));
    // bitsandbytes' own arrays through our dequantiser
    WeightTensor b;
    b.format = WeightFormat::nf4;
    b.shape = input.sizes().vec();
    b.blocksize = 64;
    b.codes = g[name + "_codes"];
    b.scales = g[name + "_absmax"];
    CHECK(at::equal(dequantize(b, dt).to(at::kFloat), g[name + "_dequant"]));
  }
}

TEST_CASE("nf4 double quantisation matches bitsandbytes compress_statistics") {
  auto g = test::load_safetensors(test::data_path("quant/nf4.safetensors"));
  at::Tensor input = g["dq_input"];
  WeightTensor w = quantize_nf4(input, 64, true);
  REQUIRE(w.double_quant());
  CHECK(at::equal(w.codes.reshape(-1), g["dq_codes"]));
  CHECK(static_cast<float>(w.nested_offset) == g["dq_offset"][0].item<float>());
  CHECK(at::equal(w.nested_scales, g["dq_nested_absmax"]));
  CHECK(at::equal(w.nested_code, g["dq_nested_code"]));
  CHECK(at::equal(w.scales, g["dq_absmax_codes"]));
  CHECK(at::equal(dequantize(w, at::kBFloat16), g["dq_dequant"]));
}

TEST_CASE("mxfp4 matches torchao to_mx / to_dtype (ties, saturation, zero, huge and tiny blocks)") {
  auto g = test::load_safetensors(test::data_path("quant/mxfp4.safetensors"));
  for (std::string name : {"fp32", "bf16"}) {
    CAPTURE(name);
    WeightTensor w = quantize_mxfp4(g[name + "_input"], -1);
    CHECK(at::equal(w.codes, g[name + "_codes"]));
    CHECK(at::equal(w.scales, g[name + "_scales"]));
    CHECK(at::equal(dequantize(w, at::kFloat), g[name + "_dequant"]));
  }
}

TEST_CASE("nvfp4 matches torchao nvfp4_quantize / NVFP4Tensor.dequantize, per tensor and per expert") {
  auto g = test::load_safetensors(test::data_path("quant/nvfp4.safetensors"));
  for (std::string name : {"fp32", "bf16"}) {
    CAPTURE(name);
    WeightTensor w = quantize_nvfp4(g[name + "_input"], -1);
    CHECK(at::equal(w.codes, g[name + "_codes"]));
    CHECK(at::equal(w.scales.view(at::kByte), g[name + "_scales"]));
    CHECK(at::equal(w.global_scale.reshape({}), g[name + "_global_scale"]));
    CHECK(at::equal(dequantize(w, at::kFloat), g[name + "_dequant"]));
  }
  WeightTensor e = quantize_nvfp4(g["experts_input"], -1, /*per_expert_global_scale=*/true);
  CHECK(at::equal(e.codes, g["experts_codes"]));
  CHECK(at::equal(e.scales.view(at::kByte), g["experts_scales"]));
  CHECK(at::equal(e.global_scale, g["experts_global_scale"]));
  CHECK(at::equal(dequantize(e, at::kFloat), g["experts_dequant"]));
}

TEST_CASE("mxfp4/nvfp4 along a middle axis equal the transposed last-axis quantisation") {
  at::Tensor w = at::randn({3, 64, 5}, at::kFloat);  // [E, K, N], blocks along K (axis 1)
  for (bool mx : {true, false}) {
    CAPTURE(mx);
    WeightTensor a = mx ? quantize_mxfp4(w, 1) : quantize_nvfp4(w, 1, true);
    WeightTensor b = mx ? quantize_mxfp4(w.transpose(1, 2).contiguous(), -1)
                        : quantize_nvfp4(w.transpose(1, 2).contiguous(), -1, true);
    CHECK(a.codes.sizes().vec() == std::vector<int64_t>{3, 32, 5});
    CHECK(at::equal(a.codes, b.codes.transpose(1, 2)));
    CHECK(at::equal(dequantize(a, at::kFloat), dequantize(b, at::kFloat).transpose(1, 2)));
    CHECK(test::rel_err(dequantize(a, at::kFloat), w) < 0.2);  // 4-bit: a sanity bound, not a contract
  }
}

TEST_CASE("selective dequant equals the rows of the full dequant, for every format") {
  at::Tensor w = at::randn({4, 16, 64}, at::kFloat);
  at::Tensor ids = at::tensor({3, 0, 3}, at::kLong);
  std::vector<WeightTensor> ws = {quantize_nf4(w), quantize_nf4(w, 64, true), quantize_mxfp4(w, -1),
                                  quantize_nvfp4(w, -1), quantize_nvfp4(w, -1, true), WeightTensor::dense(w)};
  Registry reg;
  register_reference_kernels(reg);
  auto deq = reg.kernel<Dequant>("reference");
  REQUIRE(deq);
  for (const auto& q : ws) {
    CAPTURE(q.describe());
    at::Tensor full = dequantize(q, at::kFloat);
    CHECK(at::equal(dequantize(q, at::kFloat, ids), full.index_select(0, ids)));
    if (!q.is_dense()) {
      DequantArgs a;
      a.weight = q;
      a.dtype = at::kBFloat16;
      a.experts = ids;
      CHECK(at::equal(deq->dequantize(a), full.index_select(0, ids).to(at::kBFloat16)));
      a.experts = at::Tensor();
      at::Tensor buf = at::full({4, 16, 80}, 7.0, at::kBFloat16);  // guard columns 64..79
      a.out = buf.slice(2, 0, 64);
      deq->dequantize(a);
      CHECK(at::equal(buf.slice(2, 0, 64), full.to(at::kBFloat16)));
      CHECK(at::equal(buf.slice(2, 64), at::full({4, 16, 16}, 7.0, at::kBFloat16)));
    }
  }
}

TEST_CASE("dequant rejects bad weights and arguments naming the field") {
  Registry reg;
  register_reference_kernels(reg);
  auto deq = reg.kernel<Dequant>("reference");
  at::Tensor w = at::randn({4, 8, 64});
  DequantArgs a;
  a.weight = quantize_nf4(w);
  a.weight.codes = a.weight.codes.to(at::kInt);
  CHECK(error_of([&] { deq->dequantize(a); }).find("dequant: weight.codes: must be uint8") != std::string::npos);
  a.weight = quantize_nf4(w);
  a.weight.scales = a.weight.scales.slice(0, 1);
  CHECK(error_of([&] { deq->dequantize(a); }).find("weight.scales: must have 32 elements") != std::string::npos);
  a.weight = quantize_mxfp4(w, -1);
  a.weight.scales = a.weight.scales.slice(2, 1);
  CHECK(error_of([&] { deq->dequantize(a); }).find("weight.scales: must have shape [4, 8, 2]") != std::string::npos);
  a.weight = quantize_nvfp4(w, -1);
  a.weight.global_scale = at::Tensor();
  CHECK(error_of([&] { deq->dequantize(a); }).find("weight.global_scale") != std::string::npos);
  a.weight = quantize_mxfp4(w, -1);
  a.experts = at::tensor({0, 4}, at::kLong);
  CHECK(error_of([&] { deq->dequantize(a); }).find("dequant: experts: ids must be in [0, 4), got 4") != std::string::npos);
  a.experts = at::tensor({0}, at::kInt);
  CHECK(error_of([&] { deq->dequantize(a); }).find("dequant: experts: must be int64") != std::string::npos);
  a.experts = at::Tensor();
  a.dtype = at::kInt;
  CHECK(error_of([&] { deq->dequantize(a); }).find("dequant: dtype") != std::string::npos);
  a.dtype = at::kFloat;
  a.out = at::empty({4, 8, 63});
  CHECK(error_of([&] { deq->dequantize(a); }).find("dequant: out: must have shape [4, 8, 64]") != std::string::npos);
  a.out = at::Tensor();
  a.weight = WeightTensor::dense(w);
  CHECK(error_of([&] { deq->dequantize(a); }).find("dequant: weight: is dense") != std::string::npos);
}
