// The reference backends and the quantisers on a CUDA device: bit-exact quantisation (the goldens), and
// every op's CUDA result against its CPU result, twice (determinism). Without a CUDA device each case
// says so and passes; on the GPU machine (tests run as usual) they are real.
#include <doctest/doctest.h>

#include "axengine/ops/attention.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/registry.hpp"
#include "ops/reference/register.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

bool no_cuda() {
  if (at::hasCUDA()) return false;
  MESSAGE("no CUDA device: nothing to compare on this machine");
  return true;
}

const Registry& registry() {
  static Registry reg = [] {
    Registry r;
    register_reference_kernels(r);
    return r;
  }();
  return reg;
}

const at::Device kCuda(at::kCUDA, 0);

at::Tensor cu(const at::Tensor& t) { return t.defined() ? t.to(kCuda) : t; }

// CUDA vs CPU: both compute in fp32; they differ only by summation order (and one output rounding).
double tol(at::ScalarType dt) { return dt == at::kFloat ? 1e-5 : dt == at::kBFloat16 ? 8e-3 : 1e-3; }

}  // namespace

TEST_CASE("cuda: quantisers and dequantisers match the peer goldens bit for bit") {
  if (no_cuda()) return;
  auto nf4 = test::load_safetensors(test::data_path("quant/nf4.safetensors"));
  WeightTensor w = quantize_nf4(cu(nf4["dq_input"]), 64, true);
  CHECK(at::equal(w.codes.cpu().reshape(-1), nf4["dq_codes"]));
  CHECK(at::equal(w.scales.cpu(), nf4["dq_absmax_codes"]));
  CHECK(at::equal(dequantize(w, at::kBFloat16).cpu(), nf4["dq_dequant"]));
  WeightTensor w1 = quantize_nf4(cu(nf4["fp32_input"]), 64, false);
  CHECK(at::equal(w1.codes.cpu().reshape(-1), nf4["fp32_codes"]));
  CHECK(at::equal(dequantize(w1, at::kFloat).cpu(), nf4["fp32_dequant"]));

  auto mx = test::load_safetensors(test::data_path("quant/mxfp4.safetensors"));
  WeightTensor m = quantize_mxfp4(cu(mx["fp32_input"]), -1);
  CHECK(at::equal(m.codes.cpu(), mx["fp32_codes"]));
  CHECK(at::equal(m.scales.cpu(), mx["fp32_scales"]));
  CHECK(at::equal(dequantize(m, at::kFloat).cpu(), mx["fp32_dequant"]));

  auto nv = test::load_safetensors(test::data_path("quant/nvfp4.safetensors"));
  WeightTensor n = quantize_nvfp4(cu(nv["experts_input"]), -1, true);
  CHECK(at::equal(n.codes.cpu(), nv["experts_codes"]));
  CHECK(at::equal(n.scales.cpu().view(at::kByte), nv["experts_scales"]));
  CHECK(at::equal(dequantize(n, at::kFloat).cpu(), nv["experts_dequant"]));
  at::Tensor ids = at::tensor({2, 0}, at::kLong);
  CHECK(at::equal(dequantize(n, at::kFloat, cu(ids)).cpu(), nv["experts_dequant"].index_select(0, ids)));
}

TEST_CASE("cuda: moe.experts reference equals the CPU reference, every format, deterministic") {
  if (no_cuda()) return;
  auto op = registry().kernel<MoeExperts>("reference");
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (auto f : {WeightFormat::dense, WeightFormat::nf4, WeightFormat::mxfp4, WeightFormat::nvfp4}) {
      CAPTURE(std::string(at::toString(dt)));
      CAPTURE(to_string(f));
      at::manual_seed(3);
      const int64_t T = 37, E = 6, k = 2, K = 64, N = 48, r = 4;
      MoeExpertsArgs a;
      a.routing = test::make_routing(T, E, k, 9, 0.15, false, at::tensor({2}, at::kLong));
      a.x = at::randn({T, K}).to(dt);
      at::Tensor w = at::randn({E, N, K}) / 8;  // ENK
      a.layout = ExpertLayout::ENK;
      a.weight = f == WeightFormat::dense ? WeightTensor::dense(w.to(dt))
                 : f == WeightFormat::nf4 ? quantize_nf4(w, 64, true)
                 : f == WeightFormat::mxfp4 ? quantize_mxfp4(w, 2) : quantize_nvfp4(w, 2, true);
      a.lora_a = (at::randn({r * E, K}) * 0.1).to(dt);
      a.lora_b = (at::randn({N, r * E}) * 0.1).to(dt);
      a.scaling = 2.0;
      a.bias = at::randn({E, N}).to(dt);
      a.gates = at::softmax(at::randn({T, k}), 1).to(dt);
      MoeExpertsArgs g = a;
      g.x = cu(a.x), g.lora_a = cu(a.lora_a), g.lora_b = cu(a.lora_b), g.bias = cu(a.bias), g.gates = cu(a.gates);
      g.weight = a.weight.to(kCuda);
      g.routing.sorted_expert_idxs = cu(a.routing.sorted_expert_idxs);
      g.routing.sorted_scattered_idxs = cu(a.routing.sorted_scattered_idxs);
      g.routing.expert_offsets = cu(a.routing.expert_offsets);
      at::Tensor y = op->forward(a).y, yg = op->forward(g).y;
      CHECK(test::rel_err(yg.cpu(), y) < tol(dt));
      CHECK(test::bit_equal(yg, op->forward(g).y));
      MoeExpertsBackwardArgs b, bg;
      b.grad_y = at::randn(y.sizes()).to(dt);
      bg.grad_y = cu(b.grad_y);
      MoeExpertsGrads d = op->backward(a, b), dg = op->backward(g, bg), dg2 = op->backward(g, bg);
      CHECK(test::rel_err(dg.dx.cpu(), d.dx) < tol(dt));
      CHECK(test::rel_err(dg.dlora_a.cpu(), d.dlora_a) < tol(dt));
      CHECK(test::rel_err(dg.dlora_b.cpu(), d.dlora_b) < tol(dt));
      CHECK(test::rel_err(dg.dgates.cpu(), d.dgates) < tol(dt));
      CHECK(test::bit_equal(dg.dx, dg2.dx));
      CHECK(test::bit_equal(dg.dlora_a, dg2.dlora_a));
      CHECK(test::bit_equal(dg.dlora_b, dg2.dlora_b));
      CHECK(test::bit_equal(dg.dgates, dg2.dgates));
    }
}

TEST_CASE("cuda: norm_rope, attention and linear.lora references equal the CPU references, deterministic") {
  if (no_cuda()) return;
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    CAPTURE(std::string(at::toString(dt)));
    at::manual_seed(4);
    {
      auto op = registry().kernel<NormRope>("reference");
      NormRopeArgs a;
      a.x = at::randn({2, 9, 4, 32}).to(dt);
      a.weight = (at::randn({32}) * 0.1).to(dt);
      a.weight_offset = true;
      a.position_ids = at::randint(0, 500, {2, 9}, at::kLong);
      a.inv_freq = at::pow(10000.0, -at::arange(0, 16, 2, at::kFloat) / 16);
      NormRopeArgs g = a;
      g.x = cu(a.x), g.weight = cu(a.weight), g.position_ids = cu(a.position_ids), g.inv_freq = cu(a.inv_freq);
      at::Tensor y = op->forward(a), yg = op->forward(g);
      CHECK(test::rel_err(yg.cpu(), y) < tol(dt));
      NormRopeBackwardArgs b, bg;
      b.grad_y = at::randn(y.sizes()).to(dt);
      bg.grad_y = cu(b.grad_y);
      NormRopeGrads d = op->backward(a, b), dg = op->backward(g, bg);
      CHECK(test::rel_err(dg.dx.cpu(), d.dx) < tol(dt));
      CHECK(test::rel_err(dg.dweight.cpu(), d.dweight) < tol(dt));
      CHECK(test::bit_equal(dg.dweight, op->backward(g, bg).dweight));
    }
    {
      auto op = registry().kernel<Attention>("reference");
      AttentionArgs a;
      a.q = at::randn({40, 8, 16}).to(dt);
      a.k = at::randn({40, 2, 16}).to(dt);
      a.v = at::randn({40, 2, 16}).to(dt);
      a.cu_seqlens = at::tensor({0, 17, 17, 30, 40}, at::kInt);
      a.window_left = 6;
      AttentionArgs g = a;
      g.q = cu(a.q), g.k = cu(a.k), g.v = cu(a.v), g.cu_seqlens = cu(a.cu_seqlens);
      AttentionResult r = op->forward(a), rg = op->forward(g);
      CHECK(test::rel_err(rg.out.cpu(), r.out) < tol(dt));
      CHECK(test::rel_err(rg.lse.cpu(), r.lse) < 1e-5);
      AttentionBackwardArgs b, bg;
      b.grad_out = at::randn(r.out.sizes()).to(dt);
      b.out = r.out;
      b.lse = r.lse;
      bg.grad_out = cu(b.grad_out);
      bg.out = rg.out;
      bg.lse = rg.lse;
      AttentionGrads d = op->backward(a, b), dg = op->backward(g, bg);
      CHECK(test::rel_err(dg.dq.cpu(), d.dq) < tol(dt));
      CHECK(test::rel_err(dg.dk.cpu(), d.dk) < tol(dt));
      CHECK(test::rel_err(dg.dv.cpu(), d.dv) < tol(dt));
      CHECK(test::bit_equal(dg.dk, op->backward(g, bg).dk));
    }
    {
      auto op = registry().kernel<LinearLora>("reference");
      LinearLoraArgs a;
      a.x = at::randn({3, 5, 128}).to(dt);
      a.weight = quantize_nf4(at::randn({72, 128}) / 10, 64, true);
      a.lora_a = (at::randn({8, 128}) * 0.1).to(dt);
      a.lora_b = (at::randn({72, 8}) * 0.1).to(dt);
      a.scaling = 0.5;
      LinearLoraArgs g = a;
      g.x = cu(a.x), g.weight = a.weight.to(kCuda), g.lora_a = cu(a.lora_a), g.lora_b = cu(a.lora_b);
      at::Tensor y = op->forward(a), yg = op->forward(g);
      CHECK(test::rel_err(yg.cpu(), y) < tol(dt));
      LinearLoraBackwardArgs b, bg;
      b.grad_y = at::randn(y.sizes()).to(dt);
      bg.grad_y = cu(b.grad_y);
      LinearLoraGrads d = op->backward(a, b), dg = op->backward(g, bg);
      CHECK(test::rel_err(dg.dx.cpu(), d.dx) < tol(dt));
      CHECK(test::rel_err(dg.dlora_a.cpu(), d.dlora_a) < tol(dt));
      CHECK(test::rel_err(dg.dlora_b.cpu(), d.dlora_b) < tol(dt));
      CHECK(test::bit_equal(dg.dlora_b, op->backward(g, bg).dlora_b));
    }
  }
}
