// moe.experts reference backend: forward against a naive per-(token, slot) formula, backward against
// autograd through that formula (fp64), every input mode, the edge cases of the contract and the
// validation messages.
#include <doctest/doctest.h>

#include <functional>

#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/registry.hpp"
#include "ops/reference/register.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

std::shared_ptr<MoeExperts> reference() {
  static Registry reg = [] {
    Registry r;
    register_reference_kernels(r);
    return r;
  }();
  return reg.kernel<MoeExperts>("reference");
}

struct Case {
  int64_t T = 7, E = 4, k = 2, K = 32, N = 24, r = 3;
  bool lora = true, bias = true, gates = true, grouped_in = false, grouped_out = false;
  ExpertLayout layout = ExpertLayout::EKN;
  WeightFormat format = WeightFormat::dense;
  double inactive = 0.0;
  bool inactive_last = false;
  std::vector<int64_t> skip_experts;
  uint64_t seed = 1;
};

struct Built {
  MoeExpertsArgs args;
  at::Tensor w_ekn;  // the dense [E, K, N] weight the formula uses (dequantised for quantised formats)
};

Built build(const Case& c, at::ScalarType dt = at::kDouble) {
  at::manual_seed(c.seed);
  Built b;
  auto& a = b.args;
  at::Tensor skip = c.skip_experts.empty() ? at::Tensor() : at::tensor(c.skip_experts, at::kLong);
  a.routing = test::make_routing(c.T, c.E, c.k, c.seed, c.inactive, c.inactive_last, skip);
  const int64_t M = c.T * c.k;
  a.x = at::randn({c.grouped_in ? M : c.T, c.K}, at::kDouble).to(dt);
  at::Tensor w = at::randn({c.E, c.K, c.N}, at::kDouble) / std::sqrt(double(c.K));
  at::Tensor stored = c.layout == ExpertLayout::EKN ? w : w.transpose(1, 2).contiguous();
  const int64_t kaxis = c.layout == ExpertLayout::EKN ? 1 : 2;
  switch (c.format) {
    case WeightFormat::dense: a.weight = WeightTensor::dense(stored.to(dt)); break;
    case WeightFormat::nf4: a.weight = quantize_nf4(stored.to(at::kFloat), 64, true); break;
    case WeightFormat::mxfp4: a.weight = quantize_mxfp4(stored.to(at::kFloat), kaxis); break;
    case WeightFormat::nvfp4: a.weight = quantize_nvfp4(stored.to(at::kFloat), kaxis, true); break;
  }
  at::Tensor deq = dequantize(a.weight, at::kDouble);
  b.w_ekn = c.layout == ExpertLayout::EKN ? deq : deq.transpose(1, 2);
  a.layout = c.layout;
  if (c.lora) {
    a.lora_a = (at::randn({c.r * c.E, c.K}, at::kDouble) * 0.3).to(dt);
    a.lora_b = (at::randn({c.N, c.r * c.E}, at::kDouble) * 0.3).to(dt);
    a.scaling = 0.75;
  }
  if (c.bias) a.bias = at::randn({c.E, c.N}, at::kDouble).to(dt);
  if (c.gates) a.gates = at::softmax(at::randn({c.T, c.k}, at::kDouble), 1).to(dt);
  a.grouped_in = c.grouped_in;
  a.grouped_out = c.grouped_out;
  return b;
}

// The contract written as directly as possible: one row per routing entry, autograd-friendly.
at::Tensor naive(const MoeExpertsArgs& a, const at::Tensor& w_ekn, const at::Tensor& x, const at::Tensor& A,
                 const at::Tensor& B, const at::Tensor& gates) {
  const int64_t M = a.routing.sorted_expert_idxs.numel(), k = a.routing.top_k, N = w_ekn.size(2);
  const int64_t T = M / k;
  const int64_t r = A.defined() ? A.size(0) / w_ekn.size(0) : 0;
  auto eid = a.routing.sorted_expert_idxs.contiguous();
  auto sid = a.routing.sorted_scattered_idxs.contiguous();
  std::vector<at::Tensor> grouped(M), scattered(M, at::zeros({N}, x.options()));
  for (int64_t p = 0; p < M; ++p) {
    const int64_t e = eid[p].item<int64_t>(), s = sid[p].item<int64_t>();
    if (e < 0) {
      grouped[p] = at::zeros({N}, x.options());
      continue;
    }
    at::Tensor xr = a.grouped_in ? x[p] : x[s / k];
    at::Tensor y = at::matmul(xr, w_ekn[e]);
    if (a.bias.defined()) y = y + a.bias[e];
    if (r > 0) y = y + a.scaling * at::matmul(at::matmul(xr, A.slice(0, e * r, (e + 1) * r).t()), B.slice(1, e * r, (e + 1) * r).t());
    grouped[p] = y;
    scattered[s] = y;
  }
  if (a.grouped_out) return at::stack(grouped);
  at::Tensor ys = at::stack(scattered);
  if (!gates.defined()) return ys;
  return (ys.view({T, k, N}) * gates.unsqueeze(-1)).sum(1);
}

// Forward vs the formula and backward vs autograd, in fp64.
void check_against_naive(const Case& c) {
  Built b = build(c);
  auto& a = b.args;
  MoeExpertsResult res = reference()->forward(a);

  at::Tensor x = a.x.detach().clone().set_requires_grad(true);
  at::Tensor A = c.lora ? a.lora_a.detach().clone().set_requires_grad(true) : at::Tensor();
  at::Tensor B = c.lora ? a.lora_b.detach().clone().set_requires_grad(true) : at::Tensor();
  at::Tensor G = c.gates ? a.gates.detach().clone().set_requires_grad(true) : at::Tensor();
  at::Tensor y = naive(a, b.w_ekn, x, A, B, G);
  REQUIRE(res.y.sizes() == y.sizes());
  CHECK(test::rel_err(res.y, y.detach()) < 1e-12);

  at::Tensor gy = at::randn(y.sizes(), at::kDouble);
  std::vector<at::Tensor> inputs = {x};
  if (c.lora) inputs.insert(inputs.end(), {A, B});
  if (c.gates) inputs.push_back(G);
  auto grads = torch::autograd::grad({y}, inputs, {gy}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  MoeExpertsBackwardArgs bw;
  bw.grad_y = gy;
  bw.saved = res.saved;
  MoeExpertsGrads g = reference()->backward(a, bw);
  auto same = [](const at::Tensor& got, const at::Tensor& want) {
    return want.defined() ? test::rel_err(got, want) < 1e-12 : got.abs().max().item<double>() == 0.0;
  };
  CHECK(same(g.dx, grads[0]));
  if (c.lora) {
    CHECK(same(g.dlora_a, grads[1]));
    CHECK(same(g.dlora_b, grads[2]));
  } else {
    CHECK_FALSE(g.dlora_a.defined());
  }
  if (c.gates) CHECK(same(g.dgates, grads.back()));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("moe.experts reference: forward and backward match the formula, every grouped_in/grouped_out mode") {
  for (bool gi : {false, true})
    for (bool go : {false, true}) {
      Case c;
      c.grouped_in = gi;
      c.grouped_out = go;
      c.gates = !go;  // gates need scattered output
      CAPTURE(gi);
      CAPTURE(go);
      check_against_naive(c);
    }
}

TEST_CASE("moe.experts reference: ENK layout, no LoRA, no bias, no gates") {
  Case c;
  c.layout = ExpertLayout::ENK;
  check_against_naive(c);
  c.lora = c.bias = c.gates = false;
  check_against_naive(c);
  c.layout = ExpertLayout::EKN;
  check_against_naive(c);
}

TEST_CASE("moe.experts reference: -1 routing entries contribute nothing (inside ranges and sorted last)") {
  for (bool last : {false, true}) {
    CAPTURE(last);
    Case c;
    c.T = 9;
    c.inactive = 0.4;
    c.inactive_last = last;
    check_against_naive(c);
    c.grouped_in = true;
    c.grouped_out = true;
    c.gates = false;
    check_against_naive(c);
    // every entry inactive: zeros out, zero gradients
    c.inactive = 1.0;
    Built b = build(c);
    CHECK(reference()->forward(b.args).y.abs().max().item<double>() == 0.0);
  }
}

TEST_CASE("moe.experts reference: zero-token experts, E=1, k=1, k=E, T=1, rank 1 and rank 5") {
  Case c;
  c.E = 6;
  c.k = 2;
  c.skip_experts = {1, 4};
  check_against_naive(c);
  Case one;
  one.E = 1;
  one.k = 1;
  check_against_naive(one);
  Case k1;
  k1.k = 1;
  check_against_naive(k1);
  Case kE;
  kE.k = kE.E;
  check_against_naive(kE);
  Case t1;
  t1.T = 1;
  t1.r = 1;
  check_against_naive(t1);
  Case r5;
  r5.r = 5;
  r5.grouped_in = true;
  check_against_naive(r5);
  // no tokens at all: empty outputs and gradients of the right shapes
  Case t0;
  t0.T = 0;
  Built b = build(t0);
  MoeExpertsResult res = reference()->forward(b.args);
  CHECK(res.y.sizes().vec() == std::vector<int64_t>{0, t0.N});
  MoeExpertsBackwardArgs bw;
  bw.grad_y = at::zeros({0, t0.N}, at::kDouble);
  MoeExpertsGrads g = reference()->backward(b.args, bw);
  CHECK(g.dx.sizes().vec() == std::vector<int64_t>{0, t0.K});
  CHECK(g.dlora_a.abs().sum().item<double>() == 0.0);
}

TEST_CASE("moe.experts reference: nf4 (double quant), mxfp4 and nvfp4 weights, both layouts") {
  for (auto f : {WeightFormat::nf4, WeightFormat::mxfp4, WeightFormat::nvfp4})
    for (auto l : {ExpertLayout::EKN, ExpertLayout::ENK}) {
      Case c;
      c.format = f;
      c.layout = l;
      c.inactive = 0.2;
      CAPTURE(to_string(f));
      CAPTURE(to_string(l));
      check_against_naive(c);
    }
}

TEST_CASE("moe.experts reference: bf16/fp16/fp32 runs agree with fp64 within the contract tolerance") {
  Case c;
  Built ref = build(c, at::kDouble);
  MoeExpertsBackwardArgs bw;
  at::Tensor y64 = reference()->forward(ref.args).y;
  bw.grad_y = at::randn(y64.sizes(), at::kDouble);
  MoeExpertsGrads g64 = reference()->backward(ref.args, bw);
  for (auto [dt, tol] : {std::pair{at::kFloat, 1e-5}, {at::kBFloat16, 2e-2}, {at::kHalf, 5e-3}}) {
    CAPTURE(std::string(at::toString(dt)));
    Built b = build(c, dt);
    MoeExpertsBackwardArgs bwl;
    bwl.grad_y = bw.grad_y.to(dt);
    at::Tensor y = reference()->forward(b.args).y;
    CHECK((y.scalar_type() == dt));
    // inputs were rounded to dt, so compare against fp64 on the rounded inputs
    MoeExpertsArgs a64 = b.args;
    a64.x = a64.x.to(at::kDouble);
    a64.weight = WeightTensor::dense(a64.weight.values.to(at::kDouble));
    a64.lora_a = a64.lora_a.to(at::kDouble);
    a64.lora_b = a64.lora_b.to(at::kDouble);
    a64.bias = a64.bias.to(at::kDouble);
    a64.gates = a64.gates.to(at::kDouble);
    CHECK(test::rel_err(y, reference()->forward(a64).y) < tol);
    MoeExpertsBackwardArgs bw64;
    bw64.grad_y = bwl.grad_y.to(at::kDouble);
    MoeExpertsGrads gl = reference()->backward(b.args, bwl), gd = reference()->backward(a64, bw64);
    CHECK(test::rel_err(gl.dx, gd.dx) < tol);
    CHECK(test::rel_err(gl.dlora_a, gd.dlora_a) < tol);
    CHECK(test::rel_err(gl.dlora_b, gd.dlora_b) < tol);
    CHECK(test::rel_err(gl.dgates, gd.dgates) < tol);
  }
}

TEST_CASE("moe.experts reference: deterministic, writes into preallocated outputs and nowhere else") {
  Case c;
  Built b = build(c, at::kBFloat16);
  auto& a = b.args;
  at::Tensor y1 = reference()->forward(a).y, y2 = reference()->forward(a).y;
  CHECK(test::bit_equal(y1, y2));
  MoeExpertsBackwardArgs bw;
  bw.grad_y = at::randn(y1.sizes()).to(at::kBFloat16);
  MoeExpertsGrads g1 = reference()->backward(a, bw), g2 = reference()->backward(a, bw);
  CHECK(test::bit_equal(g1.dx, g2.dx));
  CHECK(test::bit_equal(g1.dlora_a, g2.dlora_a));
  CHECK(test::bit_equal(g1.dlora_b, g2.dlora_b));
  CHECK(test::bit_equal(g1.dgates, g2.dgates));

  // out: a strided view into a guarded buffer
  at::Tensor buf = at::full({y1.size(0) + 2, y1.size(1) + 3}, 9.0, at::kBFloat16);
  a.out = buf.slice(0, 1, 1 + y1.size(0)).slice(1, 0, y1.size(1));
  at::Tensor y3 = reference()->forward(a).y;
  const bool wrote_in_place = y3.data_ptr() == a.out.data_ptr();
  CHECK(wrote_in_place);
  CHECK(test::bit_equal(a.out.contiguous(), y1));
  at::Tensor guard = buf.clone();
  guard.slice(0, 1, 1 + y1.size(0)).slice(1, 0, y1.size(1)).fill_(9.0);
  CHECK(at::equal(guard, at::full(buf.sizes(), 9.0, at::kBFloat16)));
  // non-contiguous inputs give the same answer
  a.out = at::Tensor();
  MoeExpertsArgs nc = a;
  nc.x = a.x.t().contiguous().t();
  nc.lora_b = a.lora_b.t().contiguous().t();
  CHECK(!nc.x.is_contiguous());
  CHECK(test::bit_equal(reference()->forward(nc).y, y1));
}

TEST_CASE("moe.experts: bad input is rejected with the argument named") {
  Case c;
  using Mut = std::function<void(MoeExpertsArgs&)>;
  const std::vector<std::pair<Mut, std::string>> cases = {
      {[](auto& a) { a.x = a.x.unsqueeze(0); }, "moe.experts: x: must have 2 dims"},
      {[](auto& a) { a.x = a.x.to(at::kInt); }, "moe.experts: x: must be fp32 or bf16"},
      {[](auto& a) { a.routing.top_k = 0; }, "moe.experts: routing.top_k: must be >= 1"},
      {[](auto& a) { a.routing.sorted_expert_idxs = a.routing.sorted_expert_idxs.to(at::kInt); },
       "routing.sorted_expert_idxs: must be int64"},
      {[](auto& a) { a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.slice(0, 1); },
       "routing.sorted_scattered_idxs: has 13 entries but sorted_expert_idxs has 14"},
      {[](auto& a) { a.routing.expert_offsets = a.routing.expert_offsets.slice(0, 1); },
       "routing.expert_offsets: must have one entry per expert (4), got 3"},
      {[](auto& a) { a.routing.expert_offsets = a.routing.expert_offsets.clone(); a.routing.expert_offsets[0] += 1; },
       "(routing arrays do not match)"},
      {[](auto& a) { a.routing.expert_offsets = a.routing.expert_offsets.flip(0); },
       "routing.expert_offsets: must be nondecreasing"},
      {[](auto& a) { a.routing.sorted_expert_idxs = a.routing.sorted_expert_idxs.clone(); a.routing.sorted_expert_idxs[13] = 4; },
       "routing.sorted_expert_idxs: entry 13 is 4, outside [-1, 4)"},
      {[](auto& a) { a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.clone(); a.routing.sorted_scattered_idxs[1] = a.routing.sorted_scattered_idxs[0]; },
       "routing.sorted_scattered_idxs: entry 1 repeats scattered index"},
      {[](auto& a) { a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.clone(); a.routing.sorted_scattered_idxs[2] = 14; },
       "routing.sorted_scattered_idxs: entry 2 is 14, outside [0, 14)"},
      {[](auto& a) { a.x = a.x.slice(0, 1); }, "routing.sorted_expert_idxs: has 14 entries but x has 6 tokens"},
      {[](auto& a) { a.x = a.x.slice(1, 1); }, "moe.experts: weight: has K = 32"},
      {[](auto& a) { a.weight = WeightTensor::dense(a.weight.values.to(at::kFloat)); }, "moe.experts: weight: must have x's dtype fp64"},
      {[](auto& a) { a.weight = WeightTensor::dense(a.weight.values[0]); }, "moe.experts: weight: must be 3-dim"},
      {[](auto& a) { a.weight = quantize_mxfp4(at::randn({4, 32, 32}), 2); },  // blocks along N, not K
       "moe.experts: weight.axis: mxfp4 blocks must run along K"},
      {[](auto& a) { a.lora_b = at::Tensor(); }, "moe.experts: lora_b: LoRA needs both"},
      {[](auto& a) { a.lora_b = a.lora_b.slice(0, 1); }, "moe.experts: lora_b: must have shape [24, 12]"},
      {[](auto& a) { a.lora_a = a.lora_a.slice(0, 1); }, "moe.experts: lora_a: must be [r·E, K]"},
      {[](auto& a) { a.lora_a = a.lora_a.to(at::kFloat); }, "moe.experts: lora_a: must be fp64"},
      {[](auto& a) { a.bias = a.bias.t(); }, "moe.experts: bias: must have shape [4, 24]"},
      {[](auto& a) { a.bias = a.bias.to(at::Device("meta")); }, "moe.experts: bias: is on meta but x is on cpu"},
      {[](auto& a) { a.gates = a.gates.slice(1, 1); }, "moe.experts: gates: must have shape [7, 2]"},
      {[](auto& a) { a.grouped_out = true; }, "moe.experts: gates: cannot combine outputs in grouped order"},
      {[](auto& a) { a.out = at::empty({14, 24}, at::kDouble); }, "moe.experts: out: must have shape [7, 24]"},
      {[](auto& a) { a.grouped_in = true; }, "moe.experts: x: grouped input must have one row per routing entry (14)"},
  };
  for (const auto& [mutate, want] : cases) {
    Built b = build(c);
    mutate(b.args);
    const std::string got = error_of([&] { reference()->forward(b.args); });
    CAPTURE(want);
    CAPTURE(got);
    CHECK(got.find(want) != std::string::npos);
  }
  Built b = build(c);
  MoeExpertsBackwardArgs bw;
  bw.grad_y = at::zeros({14, 24}, at::kDouble);
  CHECK(error_of([&] { reference()->backward(b.args, bw); }).find("moe.experts: grad_y: must have shape [7, 24]") !=
        std::string::npos);
  bw.grad_y = at::zeros({7, 24}, at::kDouble);
  bw.out.dgates = at::zeros({7, 3}, at::kDouble);
  CHECK(error_of([&] { reference()->backward(b.args, bw); }).find("moe.experts: out.dgates: must have shape [7, 2]") !=
        std::string::npos);
}
