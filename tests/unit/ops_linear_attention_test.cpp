// linear_attention and causal_conv1d (the Gated DeltaNet ops) and the gated RMSNorm composed from rms_norm
// and swiglu: the references against independent formulas and autograd (fp64), reference and aten
// against transformers' goldens (scripts/goldens/make_linear_attention_goldens.py), decode steps from a
// prefill's final state, and the chunked aten form over a long packed batch. Accuracy of every backend
// over the whole problem grid is the conformance suite's (CTest conformance_cli_gdn_*).
#include <doctest/doctest.h>

#include <cmath>

#include "axengine/builtins.hpp"
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"
#include "axengine/registry.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

at::Tensor offsets(const std::vector<int64_t>& lens) {
  std::vector<int32_t> cu{0};
  for (auto l : lens) cu.push_back(cu.back() + static_cast<int32_t>(l));
  return at::tensor(cu, at::kInt);
}

// ---- linear_attention ---------------------------------------------------------------------------------

struct LaCase {
  std::vector<int64_t> lens = {5, 0, 70};
  int64_t Hk = 2, Hv = 4, Dk = 8, Dv = 6;
  bool l2 = true, state = true;
  double scale = 0.0;
};

struct LaData {
  at::Tensor q, k, v, g, beta, init, go, gf;
};

LaData la_data(const LaCase& c, at::ScalarType dt, uint64_t seed) {
  at::manual_seed(seed);
  int64_t T = 0;
  for (auto l : c.lens) T += l;
  const int64_t N = static_cast<int64_t>(c.lens.size());
  LaData d;
  d.q = at::randn({T, c.Hk, c.Dk}, at::kDouble);
  d.k = at::randn({T, c.Hk, c.Dk}, at::kDouble);
  if (!c.l2) d.k = d.k / d.k.norm(2, -1, true);
  d.v = at::randn({T, c.Hv, c.Dv}, at::kDouble);
  d.g = -at::softplus(at::randn({T, c.Hv}, at::kDouble)) * at::rand({c.Hv}, at::kDouble);
  d.beta = at::sigmoid(at::randn({T, c.Hv}, at::kDouble));
  d.init = at::randn({N, c.Hv, c.Dk, c.Dv}, at::kDouble) * 0.5;
  d.go = at::randn({T, c.Hv, c.Dv}, at::kDouble);
  d.gf = at::randn({N, c.Hv, c.Dk, c.Dv}, at::kDouble) * 0.5;
  for (at::Tensor* t : {&d.q, &d.k, &d.v, &d.beta, &d.go}) *t = t->to(dt);
  const auto st = dt == at::kDouble ? at::kDouble : at::kFloat;
  for (at::Tensor* t : {&d.g, &d.init, &d.gf}) *t = t->to(st);
  return d;
}

LinearAttentionArgs la_args(const LaCase& c, const LaData& d) {
  LinearAttentionArgs a;
  a.q = d.q, a.k = d.k, a.v = d.v, a.g = d.g, a.beta = d.beta;
  a.cu_seqlens = offsets(c.lens);
  a.scale = c.scale;
  a.qk_l2norm = c.l2;
  if (c.state) {
    a.initial_state = d.init;
    a.output_final_state = true;
  }
  return a;
}

// The delta rule in its textbook form, per sequence and value head: S_t = e^{g_t}(I − β_t k_t k_tᵀ) S_{t−1}
// + β_t k_t v_tᵀ, o_t = S_tᵀ (scale·q_t), with value head h reading key head h / (Hv/Hk). Returns
// {out, final states}; differentiable.
std::pair<at::Tensor, at::Tensor> delta_rule(const LaCase& c, at::Tensor q, at::Tensor k, const at::Tensor& v,
                                             const at::Tensor& g, const at::Tensor& beta, const at::Tensor& init) {
  if (c.l2) {
    q = q / at::sqrt((q * q).sum(-1, true) + 1e-6);
    k = k / at::sqrt((k * k).sum(-1, true) + 1e-6);
  }
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.Dk));
  std::vector<at::Tensor> rows, finals;
  const at::Tensor eye = at::eye(c.Dk, q.options());
  int64_t t0 = 0;
  for (std::size_t b = 0; b < c.lens.size(); ++b) {
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < c.Hv; ++h) {
      const int64_t hk = h / (c.Hv / c.Hk);
      at::Tensor S = init.defined() ? init[b][h] : at::zeros({c.Dk, c.Dv}, q.options());
      for (int64_t t = t0; t < t0 + c.lens[b]; ++t) {
        at::Tensor kt = k[t][hk].unsqueeze(1);  // [Dk, 1]
        S = at::exp(g[t][h]) * at::matmul(eye - beta[t][h] * at::matmul(kt, kt.t()), S) +
            beta[t][h] * at::matmul(kt, v[t][h].unsqueeze(0));
        rows.push_back(at::matmul(S.t(), q[t][hk] * scale));
      }
      heads.push_back(S);
    }
    finals.push_back(at::stack(heads));
    t0 += c.lens[b];
  }
  // rows were collected head-major within each sequence: reorder to [T, Hv, Dv]
  std::vector<at::Tensor> out;
  int64_t base = 0;
  t0 = 0;
  for (std::size_t b = 0; b < c.lens.size(); ++b) {
    for (int64_t i = 0; i < c.lens[b]; ++i) {
      std::vector<at::Tensor> hs;
      for (int64_t h = 0; h < c.Hv; ++h) hs.push_back(rows[base + h * c.lens[b] + i]);
      out.push_back(at::stack(hs));
    }
    base += c.Hv * c.lens[b];
  }
  return {at::stack(out), at::stack(finals)};
}

void check_reference(const LaCase& c) {
  auto op = ax::test::builtin_backend<LinearAttention>("reference");
  LaData d = la_data(c, at::kDouble, 11);
  LinearAttentionArgs a = la_args(c, d);
  auto r = op->forward(a);
  at::Tensor lq = leaf(d.q), lk = leaf(d.k), lv = leaf(d.v), lg = leaf(d.g), lb = leaf(d.beta);
  at::Tensor li = c.state ? leaf(d.init) : at::Tensor();
  auto [o, fin] = delta_rule(c, lq, lk, lv, lg, lb, li);
  CHECK(test::rel_err(r.out, o) < 1e-12);
  CHECK(r.final_state.defined() == c.state);
  if (c.state) CHECK(test::rel_err(r.final_state, fin) < 1e-12);

  std::vector<at::Tensor> in{lq, lk, lv, lg, lb};
  std::vector<at::Tensor> outs{o}, grads{d.go};
  if (c.state) {
    in.push_back(li);
    outs.push_back(fin);
    grads.push_back(d.gf);
  }
  auto want = torch::autograd::grad(outs, in, grads);
  LinearAttentionBackwardArgs b;
  b.grad_out = d.go;
  if (c.state) b.grad_final_state = d.gf;
  auto g = op->backward(a, b);
  CHECK(test::rel_err(g.dq, want[0]) < 1e-12);
  CHECK(test::rel_err(g.dk, want[1]) < 1e-12);
  CHECK(test::rel_err(g.dv, want[2]) < 1e-12);
  CHECK(test::rel_err(g.dg, want[3]) < 1e-12);
  CHECK(test::rel_err(g.dbeta, want[4]) < 1e-12);
  CHECK(g.dinitial_state.defined() == c.state);
  if (c.state) CHECK(test::rel_err(g.dinitial_state, want[5]) < 1e-12);
}

// ---- causal_conv1d ------------------------------------------------------------------------------------

// y[p] = silu(Σ_i w[:, i] · x[p − (W−1) + i]) per sequence, the rows before it from the state (or zero);
// and the last W−1 inputs. Written with an explicit pad per sequence; differentiable.
std::pair<at::Tensor, at::Tensor> conv_formula(const std::vector<int64_t>& lens, const at::Tensor& x, const at::Tensor& w,
                                               const at::Tensor& init) {
  const int64_t W = w.size(1), C = x.size(1);
  std::vector<at::Tensor> ys, fins;
  int64_t t0 = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    at::Tensor before = init.defined() ? init[b] : at::zeros({W - 1, C}, x.options());
    at::Tensor ext = at::cat({before, x.slice(0, t0, t0 + lens[b])});
    for (int64_t p = 0; p < lens[b]; ++p) {
      at::Tensor acc = at::zeros({C}, x.options());
      for (int64_t i = 0; i < W; ++i) acc = acc + w.select(1, i) * ext[p + i];
      ys.push_back(at::silu(acc));
    }
    fins.push_back(ext.slice(0, lens[b], lens[b] + W - 1));
    t0 += lens[b];
  }
  return {ys.empty() ? at::zeros({0, C}, x.options()) : at::stack(ys), at::stack(fins)};
}

}  // namespace

TEST_CASE("linear_attention reference: the recurrence against the delta rule e^g(I − βkkᵀ)S + βkvᵀ and autograd, fp64") {
  check_reference({});                                                    // packed, an empty sequence, Hv = 2·Hk, states
  check_reference({.lens = {1}, .Hk = 1, .Hv = 1, .Dk = 4, .Dv = 4});      // one row
  check_reference({.lens = {66, 3}, .Hk = 1, .Hv = 3, .Dk = 5, .Dv = 7, .l2 = false, .state = false, .scale = 0.3});
}

TEST_CASE("linear_attention reference and aten match transformers' chunk and recurrent gated delta rule, and a decode step") {
  // goldens: scripts/goldens/make_linear_attention_goldens.py (transformers 5.23 qwen3_next, fp32, autograd)
  auto gold = test::load_safetensors(test::data_path("ops/linear_attention.safetensors"));
  auto rows = [](const at::Tensor& t) { return t.flatten(0, 1); };  // [B, S, ...] → packed [B·S, ...]
  for (const char* name : {"reference", "aten"}) {
    CAPTURE(name);
    auto op = ax::test::builtin_backend<LinearAttention>(name);
    {  // the chunked form: 2 sequences of 90 rows, Hk = 2, Hv = 4, L2 norm inside, states in and out
      LinearAttentionArgs a;
      a.q = rows(gold["chunk_q"]), a.k = rows(gold["chunk_k"]), a.v = rows(gold["chunk_v"]);
      a.g = rows(gold["chunk_g"]), a.beta = rows(gold["chunk_beta"]);
      a.cu_seqlens = offsets({90, 90});
      a.qk_l2norm = true;
      a.initial_state = gold["chunk_initial_state"];
      a.output_final_state = true;
      auto r = op->forward(a);
      CHECK(test::rel_err(r.out, rows(gold["chunk_out"])) < 1e-5);
      CHECK(test::rel_err(r.final_state, gold["chunk_final_state"]) < 1e-5);
      LinearAttentionBackwardArgs b;
      b.grad_out = rows(gold["chunk_grad_out"]);
      b.grad_final_state = gold["chunk_grad_final_state"];
      b.saved = r.saved;
      auto g = op->backward(a, b);
      CHECK(test::rel_err(g.dq, rows(gold["chunk_dq"])) < 1e-5);
      CHECK(test::rel_err(g.dk, rows(gold["chunk_dk"])) < 1e-5);
      CHECK(test::rel_err(g.dv, rows(gold["chunk_dv"])) < 1e-5);
      CHECK(test::rel_err(g.dg, rows(gold["chunk_dg"])) < 1e-5);
      CHECK(test::rel_err(g.dbeta, rows(gold["chunk_dbeta"])) < 1e-5);
      CHECK(test::rel_err(g.dinitial_state, gold["chunk_dinitial_state"]) < 1e-5);

      // One decode row per sequence from our own final state: transformers' recurrent step from its own.
      LinearAttentionArgs d;
      d.q = rows(gold["decode_q"]), d.k = rows(gold["decode_k"]), d.v = rows(gold["decode_v"]);
      d.g = rows(gold["decode_g"]), d.beta = rows(gold["decode_beta"]);
      d.cu_seqlens = offsets({1, 1});
      d.qk_l2norm = true;
      d.initial_state = r.final_state;
      d.output_final_state = true;
      auto rd = op->forward(d);
      CHECK(test::rel_err(rd.out, rows(gold["decode_out"])) < 1e-5);
      CHECK(test::rel_err(rd.final_state, gold["decode_final_state"]) < 1e-5);
    }
    {  // the recurrent form: one sequence of 37 rows, Hk = Hv = 3, no norm inside, no state
      LinearAttentionArgs a;
      a.q = rows(gold["recur_q"]), a.k = rows(gold["recur_k"]), a.v = rows(gold["recur_v"]);
      a.g = rows(gold["recur_g"]), a.beta = rows(gold["recur_beta"]);
      a.cu_seqlens = offsets({37});
      auto r = op->forward(a);
      CHECK_FALSE(r.final_state.defined());
      CHECK(test::rel_err(r.out, rows(gold["recur_out"])) < 1e-5);
      LinearAttentionBackwardArgs b;
      b.grad_out = rows(gold["recur_grad_out"]);
      b.saved = r.saved;
      auto g = op->backward(a, b);
      CHECK(test::rel_err(g.dq, rows(gold["recur_dq"])) < 1e-5);
      CHECK(test::rel_err(g.dk, rows(gold["recur_dk"])) < 1e-5);
      CHECK(test::rel_err(g.dv, rows(gold["recur_dv"])) < 1e-5);
      CHECK(test::rel_err(g.dg, rows(gold["recur_dg"])) < 1e-5);
      CHECK(test::rel_err(g.dbeta, rows(gold["recur_dbeta"])) < 1e-5);
      CHECK_FALSE(g.dinitial_state.defined());
    }
  }
}

TEST_CASE("linear_attention aten: many chunks across many sequence boundaries equal the reference; bf16 in tolerance") {
  // Mixed lengths whose chunks start mid-batch: the scan walks 16 chunk slots and resets at each sequence.
  const LaCase c{.lens = {130, 1, 64, 65, 0, 200, 17, 63}, .Hk = 2, .Hv = 4, .Dk = 16, .Dv = 16};
  auto ref = ax::test::builtin_backend<LinearAttention>("reference");
  auto aten = ax::test::builtin_backend<LinearAttention>("aten");
  for (auto [dt, tol] : {std::pair{at::kFloat, 1e-5}, std::pair{at::kBFloat16, 2e-2}}) {
    CAPTURE(std::string(at::toString(dt)));
    LaData d = la_data(c, dt, 5);
    LinearAttentionArgs a = la_args(c, d);
    auto rr = ref->forward(a), ra = aten->forward(a);
    CHECK(test::rel_err(ra.out, rr.out) < tol);
    CHECK(test::rel_err(ra.final_state, rr.final_state) < tol);
    LinearAttentionBackwardArgs b;
    b.grad_out = d.go;
    b.grad_final_state = d.gf;
    auto gr = ref->backward(a, b), ga = aten->backward(a, b);
    for (auto [got, want] : std::vector<std::pair<at::Tensor, at::Tensor>>{
             {ga.dq, gr.dq}, {ga.dk, gr.dk}, {ga.dv, gr.dv}, {ga.dg, gr.dg}, {ga.dbeta, gr.dbeta},
             {ga.dinitial_state, gr.dinitial_state}})
      CHECK(test::rel_err(got, want) < tol);
    CHECK(test::bit_equal(ga.dk, aten->backward(a, b).dk));
  }
}

TEST_CASE("causal_conv1d reference: formula and autograd, fp64 (windows cut at sequence boundaries, states)") {
  auto op = ax::test::builtin_backend<CausalConv1d>("reference");
  at::manual_seed(4);
  const std::vector<int64_t> lens = {2, 7, 0, 1, 5};
  for (int64_t W : {4, 1})
    for (bool state : {false, true}) {
      CAPTURE(W);
      CAPTURE(state);
      at::Tensor x = at::randn({15, 6}, at::kDouble), w = at::randn({6, W}, at::kDouble);
      at::Tensor init = at::randn({5, W - 1, 6}, at::kDouble), gy = at::randn({15, 6}, at::kDouble);
      at::Tensor gf = at::randn({5, W - 1, 6}, at::kDouble);
      CausalConv1dArgs a;
      a.x = x, a.weight = w, a.cu_seqlens = offsets(lens);
      if (state) a.initial_state = init, a.output_final_state = true;
      auto r = op->forward(a);
      at::Tensor lx = leaf(x), li = state ? leaf(init) : at::Tensor();
      auto [y, fin] = conv_formula(lens, lx, w, li);
      CHECK(test::rel_err(r.y, y) < 1e-13);
      if (state) CHECK(test::rel_err(r.final_state, fin) < 1e-13);
      CausalConv1dBackwardArgs b;
      b.grad_y = gy;
      if (state) b.grad_final_state = gf;
      auto g = op->backward(a, b);
      auto want = state ? torch::autograd::grad({y, fin}, {lx, li}, {gy, gf}) : torch::autograd::grad({y}, {lx}, {gy});
      CHECK(test::rel_err(g.dx, want[0]) < 1e-13);
      CHECK(g.dinitial_state.defined() == state);
      if (state) CHECK(test::rel_err(g.dinitial_state, want[1]) < 1e-13);
    }
}

TEST_CASE("causal_conv1d reference and aten match transformers' causal_conv1d_fn, its cache state and causal_conv1d_update") {
  auto gold = test::load_safetensors(test::data_path("ops/linear_attention.safetensors"));
  // transformers' [B, C, S] → packed [B·S, C]
  auto rows = [](const at::Tensor& t) { return t.transpose(1, 2).flatten(0, 1).contiguous(); };
  const at::Tensor x = gold["conv_x"];
  const int64_t B = x.size(0), S = x.size(2);
  for (const char* name : {"reference", "aten"}) {
    CAPTURE(name);
    auto op = ax::test::builtin_backend<CausalConv1d>(name);
    CausalConv1dArgs a;
    a.x = rows(x), a.weight = gold["conv_weight"], a.cu_seqlens = offsets(std::vector<int64_t>(B, S));
    a.output_final_state = true;
    auto r = op->forward(a);
    CHECK(test::rel_err(r.y, rows(gold["conv_y"])) < 1e-6);
    // The cache keeps the last W inputs; the contract's state is the last W−1 (all a step reads).
    const int64_t W = a.weight.size(1);
    CHECK(test::rel_err(r.final_state, gold["conv_cache_state"].narrow(2, 1, W - 1).transpose(1, 2)) == 0);
    CausalConv1dBackwardArgs b;
    b.grad_y = rows(gold["conv_grad_y"]);
    CHECK(test::rel_err(op->backward(a, b).dx, rows(gold["conv_dx"])) < 1e-6);
    CausalConv1dArgs d;
    d.x = rows(gold["conv_decode_x"]), d.weight = a.weight, d.cu_seqlens = offsets({1, 1});
    d.initial_state = r.final_state;
    CHECK(test::rel_err(op->forward(d).y, rows(gold["conv_decode_y"])) < 1e-6);
  }
}

TEST_CASE("gated RMSNorm = rms_norm then swiglu(gate = z): transformers' Qwen3NextRMSNormGated in fp32 and bf16") {
  // norm(x)·silu(z) with transformers' rounding points is exactly rms_norm (no residual, w) followed by
  // swiglu with the gate z and the normalised value as `up` (docs/ops/linear_attention.md, "The layer").
  auto gold = test::load_safetensors(test::data_path("ops/linear_attention.safetensors"));
  const double eps = gold["gnorm_eps"][0].item<double>();
  auto gated = [&](const std::string& name, at::ScalarType dt) {
    auto norm = ax::test::builtin_backend<RmsNorm>(name);
    auto act = ax::test::builtin_backend<Swiglu>(name);
    RmsNormArgs n{gold["gnorm_x"].to(dt), {}, gold["gnorm_weight"].to(dt), eps, false};
    auto h = norm->forward(n);
    SwigluArgs s;
    s.gate = gold["gnorm_z"].to(dt);
    s.up = h.y;
    return std::tuple{act->forward(s), n, h, s};
  };
  {
    auto [y, n, h, s] = gated("reference", at::kFloat);
    CHECK(test::rel_err(y, gold["gnorm_y"]) < 1e-6);
    SwigluBackwardArgs sb{gold["gnorm_grad_y"]};
    auto gs = ax::test::builtin_backend<Swiglu>("reference")->backward(s, sb);
    RmsNormBackwardArgs nb;
    nb.grad_y = gs.dup;
    nb.sum = n.x;
    nb.rstd = h.rstd;
    nb.need_dweight = false;
    auto gn = ax::test::builtin_backend<RmsNorm>("reference")->backward(n, nb);
    CHECK(test::rel_err(gn.dx, gold["gnorm_dx"]) < 1e-5);
    CHECK(test::rel_err(gs.dgate, gold["gnorm_dz"]) < 1e-5);
  }
  for (const char* name : {"reference", "aten"}) {  // bf16: the same rounding points (a last-bit flip at most)
    CAPTURE(name);
    CHECK(test::rel_err(std::get<0>(gated(name, at::kBFloat16)), gold["gnorm_y_bf16"]) < 1e-3);
  }
}
