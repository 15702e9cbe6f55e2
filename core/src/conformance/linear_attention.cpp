// The conformance problems of linear_attention (docs/ops/linear_attention.md): out, final_state and every
// gradient against the reference over packed batches — several sequences in one row block, a sequence
// shorter than a chunk, lengths that are not multiples of 64, a length-1 and an empty sequence — head
// ratios Hv = Hk, 2·Hk and 3·Hk, Dk ≠ Dv, q/k L2-normalised inside or not, a given scale, initial states
// in and final states out (with their gradients), q/k/v as non-contiguous slices of one fused projection,
// a preallocated out; determinism and bad input. The checks are the suite's generic ones (suite.cpp).
//
// The data make every term count: some heads decay slowly (the state carries across chunks, and across a
// sequence boundary if a backend failed to reset it), some fast; β spans (0, 1); the initial states are of
// the size the rows write.
#include <cmath>

#include "axengine/ops/linear_attention.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::LinearAttention;
using ops::LinearAttentionArgs;
using ops::LinearAttentionBackwardArgs;
using ops::LinearAttentionGrads;
using ops::LinearAttentionResult;

struct Shape {
  std::vector<int64_t> seqlens;
  int64_t Hk, Hv, Dk, Dv;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : seqlens) d.push_back(std::to_string(v));
    return ax::str("seqlens=", join(d, "+"), ",", kv({{"Hk", Hk}, {"Hv", Hv}, {"Dk", Dk}, {"Dv", Dv}}));
  }
  int64_t T() const {
    int64_t t = 0;
    for (auto v : seqlens) t += v;
    return t;
  }
  int64_t N() const { return static_cast<int64_t>(seqlens.size()); }
};

struct Variant {
  bool l2 = true;        // qk_l2norm (as Qwen3-Next / Qwen3.5 call it); without, k is drawn unit-norm
  double scale = 0.0;    // 0: the default 1/sqrt(Dk)
  bool state = false;    // initial_state in, final_state out, grad_final_state back
  bool noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{l2 ? "l2" : "nol2"};
    if (scale > 0) p.push_back(ax::str("scale=", scale));
    if (state) p.push_back("state");
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

struct Data {
  at::Tensor q, k, v, g, beta, cu, init, grad, grad_final;
};

Data make_data(const Shape& s, bool l2, const std::string& name, unsigned seed) {
  at::Generator gen = case_generator(seed, name);
  const int64_t T = s.T();
  Data p;
  p.q = at::randn({T, s.Hk, s.Dk}, gen, at::kFloat);
  p.k = at::randn({T, s.Hk, s.Dk}, gen, at::kFloat);
  // Without the L2 norm inside, the caller normalises k (the delta rule is stable for β·|k|² <= 2).
  if (!l2) p.k = p.k / p.k.norm(2, -1, /*keepdim=*/true);
  p.v = at::randn({T, s.Hv, s.Dv}, gen, at::kFloat);
  // transformers' g = −exp(A_log)·softplus(a + dt_bias): per-head rates from 0.02 (the state lives for
  // hundreds of rows) to 1 (a few rows).
  at::Tensor rate = at::exp(at::rand({s.Hv}, gen, at::kFloat) * std::log(50.0)) * 0.02;
  p.g = -at::softplus(at::randn({T, s.Hv}, gen, at::kFloat)) * rate;
  p.beta = at::sigmoid(at::randn({T, s.Hv}, gen, at::kFloat) * 1.5);
  std::vector<int32_t> cu{0};
  for (auto l : s.seqlens) cu.push_back(cu.back() + static_cast<int32_t>(l));
  p.cu = at::tensor(cu, at::kInt);
  p.init = at::randn({s.N(), s.Hv, s.Dk, s.Dv}, gen, at::kFloat) * 0.5;
  p.grad = at::randn({T, s.Hv, s.Dv}, gen, at::kFloat);
  p.grad_final = at::randn({s.N(), s.Hv, s.Dk, s.Dv}, gen, at::kFloat) * 0.5;
  return p;
}

LinearAttentionArgs make_args(const Data& p, const Shape& s, const Variant& v, at::ScalarType dt, at::Device dev,
                              bool noncontig) {
  LinearAttentionArgs a;
  if (noncontig) {
    // q, k, v as slices of one fused [T, 2·Hk·Dk + Hv·Dv] row, as the conv1d output is split in the model.
    at::Tensor fused = at::cat({p.q.flatten(1), p.k.flatten(1), p.v.flatten(1)}, 1).to(dev, dt);
    const int64_t nk = s.Hk * s.Dk;
    a.q = fused.narrow(1, 0, nk).unflatten(1, {s.Hk, s.Dk});
    a.k = fused.narrow(1, nk, nk).unflatten(1, {s.Hk, s.Dk});
    a.v = fused.narrow(1, 2 * nk, s.Hv * s.Dv).unflatten(1, {s.Hv, s.Dv});
    a.beta = non_contiguous(p.beta.to(dev, dt));
    a.g = non_contiguous(p.g.to(dev));
  } else {
    a.q = p.q.to(dev, dt);
    a.k = p.k.to(dev, dt);
    a.v = p.v.to(dev, dt);
    a.beta = p.beta.to(dev, dt);
    a.g = p.g.to(dev);  // fp32 whatever the dtype (the contract)
  }
  a.cu_seqlens = p.cu.to(dev);
  a.scale = v.scale;
  a.qk_l2norm = v.l2;
  if (v.state) {
    a.initial_state = p.init.to(dev);
    a.output_final_state = true;
  }
  return a;
}

Tensors inputs_of(const LinearAttentionArgs& a) {
  Tensors in = {{"q", a.q}, {"k", a.k}, {"v", a.v}, {"g", a.g}, {"beta", a.beta}, {"cu_seqlens", a.cu_seqlens}};
  if (a.initial_state.defined()) in.emplace_back("initial_state", a.initial_state);
  return in;
}

// phase "fwd": out (and final_state); "bwd": the gradients; "fwd+bwd": all (determinism).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("linear_attention/", phase == "fwd+bwd" ? "determinism" : phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, v.l2, b.draw ? key + "#1" : key, seed);  // the same sequence lengths in every draw
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<LinearAttentionArgs>(make_args(d, s, v, dt, b.device, noncontig));
    args->check_values = !b.for_graph;  // the value checks read cu_seqlens on the host
    at::Tensor grad = d.grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    at::Tensor grad_final = v.state ? d.grad_final.to(b.device) : at::Tensor();
    Call c;
    c.inputs = inputs_of(*args);
    if (phase != "fwd") {
      c.inputs.emplace_back("grad_out", grad);
      if (grad_final.defined()) c.inputs.emplace_back("grad_final_state", grad_final);
    }
    c.run = [args, grad, grad_final, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<LinearAttention>();
      // A call the backend declines goes to the next backend in the engine: nothing of this one to certify.
      if (auto why = op.decline(*args)) skip(ax::str("the backend declines this call: ", *why));
      Tensors res;
      LinearAttentionArgs a = *args;
      a.out = output(out, "out");
      LinearAttentionResult r = op.forward(a);
      if (phase != "bwd") {
        res.emplace_back("out", r.out);
        if (args->output_final_state) res.emplace_back("final_state", r.final_state);
      }
      if (phase != "fwd") {
        LinearAttentionBackwardArgs bw;
        bw.grad_out = grad;
        bw.grad_final_state = grad_final;
        bw.saved = r.saved;
        LinearAttentionGrads g = op.backward(*args, bw);
        res.insert(res.end(), {{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}, {"dg", g.dg}, {"dbeta", g.dbeta}});
        if (args->initial_state.defined()) res.emplace_back("dinitial_state", g.dinitial_state);
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  if (phase == "fwd") {
    p.compare = {{"out", tol.forward}};
    if (v.state) p.compare.emplace_back("final_state", tol.forward);
    if (v.out) p.preallocated = {"out"};
  } else if (phase == "bwd") {
    for (const char* o : {"dq", "dk", "dv", "dg", "dbeta"}) p.compare.emplace_back(o, tol.backward);
    if (v.state) p.compare.emplace_back("dinitial_state", tol.backward);
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{{3, 4}, 2, 4, 16, 8};
  const at::ScalarType dt = scalar_type(dtype);
  Data p = make_data(s, true, ax::str("linear_attention/badinput/", dtype), suite.seed());
  const LinearAttentionArgs good = make_args(p, s, {.state = true}, dt, suite.device(), false);
  auto fwd = [](const Backend& be, const LinearAttentionArgs& a) { be.as<LinearAttention>().forward(a); };
  auto bwd = [](const Backend& be, const LinearAttentionArgs& a, LinearAttentionBackwardArgs b) {
    auto& op = be.as<LinearAttention>();
    b.saved = op.forward(a).saved;
    op.backward(a, b);
  };
  auto opt = at::TensorOptions().device(suite.device());
  const at::Tensor grad = p.grad.to(suite.device(), dt);
  using B = const Backend&;
  return {
      {"v_heads_not_multiple", "v", [=](B be) { auto a = good; a.v = at::zeros({7, 3, 8}, opt.dtype(dt)); fwd(be, a); }},
      {"k_head_dim", "k", [=](B be) { auto a = good; a.k = a.k.narrow(2, 0, 15); fwd(be, a); }},
      {"q_dtype", "q", [=](B be) { auto a = good; a.q = a.q.to(at::kInt); fwd(be, a); }},
      {"g_dtype", "g", [=](B be) { auto a = good; a.g = a.g.to(at::kHalf); fwd(be, a); }},
      {"beta_shape", "beta", [=](B be) { auto a = good; a.beta = a.beta.narrow(1, 0, 2); fwd(be, a); }},
      {"cu_seqlens_dtype", "cu_seqlens", [=](B be) { auto a = good; a.cu_seqlens = a.cu_seqlens.to(at::kLong); fwd(be, a); }},
      {"cu_seqlens_total", "cu_seqlens",
       [=](B be) { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 3, 6}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"cu_seqlens_decreasing", "cu_seqlens",
       [=](B be) { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 5, 3, 7}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"initial_state_sequences", "initial_state",
       [=](B be) { auto a = good; a.initial_state = a.initial_state.narrow(0, 0, 1); fwd(be, a); }},
      {"initial_state_dtype", "initial_state",
       [=](B be) { auto a = good; a.initial_state = a.initial_state.to(at::kDouble); fwd(be, a); }},
      {"scale_negative", "scale", [=](B be) { auto a = good; a.scale = -1.0; fwd(be, a); }},
      {"out_shape", "out", [=](B be) { auto a = good; a.out = at::empty({7, 4, 7}, opt.dtype(dt)); fwd(be, a); }},
      {"grad_out_shape", "grad_out",
       [=](B be) {
         LinearAttentionBackwardArgs b;
         b.grad_out = at::zeros({7, 4, 9}, opt.dtype(dt));
         bwd(be, good, b);
       }},
      {"grad_final_state_unasked", "grad_final_state",
       [=](B be) {
         auto a = good;
         a.output_final_state = false;
         LinearAttentionBackwardArgs b;
         b.grad_out = grad;
         b.grad_final_state = p.grad_final.to(suite.device());
         bwd(be, a, b);
       }},
  };
}

}  // namespace

void linear_attention_problems(Suite& suite) {
  std::vector<Shape> shapes = {
      {{100}, 2, 2, 32, 32},           // one sequence over a chunk boundary, not a multiple of 64, Hv = Hk
      {{37, 64, 1, 130}, 2, 4, 32, 16},  // packed: shorter than a chunk, exactly one, length 1, 2 chunks + 2; Hv = 2·Hk
      {{0, 5, 70}, 1, 3, 24, 40},      // an empty sequence first, Hv = 3·Hk, Dk ≠ Dv, not powers of two
      {{1}, 1, 1, 16, 16},             // T = 1
  };
  if (!suite.quick()) shapes.push_back({{257, 130, 17}, 4, 8, 128, 128});
  const std::vector<Variant> vs = {
      {}, {.l2 = false, .scale = 0.3}, {.state = true}, {.noncontig = true, .out = true}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], vs[j]);
          p.graph = i == 1 && (j == 2 || j == 3);  // packed with states, and strided inputs into a preallocated out
          suite.accuracy(p);
        }
    suite.determinism(problem(suite, "fwd+bwd", dtype, {{40, 90}, 2, 4, 32, 32}, {.state = true}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
