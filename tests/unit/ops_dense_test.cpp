// norm_rope, attention and linear.lora reference backends: forward against independent formulas,
// backward against autograd through them (fp64), lower-precision runs within the contract tolerance,
// determinism and the validation messages.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "axengine/ops/attention.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/registry.hpp"
#include "ops/reference/register.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

const Registry& registry() {
  static Registry reg = [] {
    Registry r;
    register_reference_kernels(r);
    return r;
  }();
  return reg;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

std::vector<at::Tensor> grads_of(const at::Tensor& y, const at::Tensor& gy, const std::vector<at::Tensor>& in) {
  return torch::autograd::grad({y}, in, {gy}, false, false, /*allow_unused=*/true);
}

// ---- norm_rope -------------------------------------------------------------------------------------

// RMSNorm then rotation written pair by pair: (u_i, u_{i+R/2}) -> (u_i c_i − u_{i+R/2} s_i,
// u_{i+R/2} c_{i+R/2} + u_i s_{i+R/2}).
at::Tensor naive_norm_rope(const at::Tensor& x, const at::Tensor& w, double eps, bool offset, const at::Tensor& cos,
                           const at::Tensor& sin) {
  at::Tensor n = x / at::sqrt((x * x).sum(-1, true) / x.size(-1) + eps) * (offset ? w + 1 : w);
  const int64_t R = cos.size(-1), h = R / 2;
  at::Tensor c = cos.unsqueeze(-2), s = sin.unsqueeze(-2);
  at::Tensor u1 = n.slice(-1, 0, h), u2 = n.slice(-1, h, R);
  at::Tensor y1 = u1 * c.slice(-1, 0, h) - u2 * s.slice(-1, 0, h);
  at::Tensor y2 = u2 * c.slice(-1, h, R) + u1 * s.slice(-1, h, R);
  return at::cat({y1, y2, n.slice(-1, R)}, -1);
}

struct RopeCase {
  std::vector<int64_t> lead = {9};
  int64_t H = 3, D = 16, R = 16;
  bool offset = false, computed = false;
};

NormRopeArgs build_rope(const RopeCase& c, at::ScalarType dt, at::Tensor* cos_out, at::Tensor* sin_out) {
  at::manual_seed(7);
  NormRopeArgs a;
  auto xs = c.lead;
  xs.push_back(c.H);
  xs.push_back(c.D);
  a.x = at::randn(xs, at::kDouble).to(dt);
  a.weight = (at::randn({c.D}, at::kDouble) * 0.2 + (c.offset ? 0.0 : 1.0)).to(dt);
  a.eps = 1e-6;
  a.weight_offset = c.offset;
  at::Tensor pos = at::randint(0, 100, c.lead, at::kLong);
  at::Tensor inv = at::pow(10000.0, -at::arange(0, c.R, 2, at::kDouble) / c.R).to(at::kFloat);
  at::Tensor freqs = pos.to(at::kDouble).unsqueeze(-1) * inv.to(at::kDouble);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  const double scaling = c.computed ? 1.25 : 1.0;
  *cos_out = emb.cos() * scaling;
  *sin_out = emb.sin() * scaling;
  if (c.computed) {
    a.position_ids = pos;
    a.inv_freq = inv;
    a.attention_scaling = scaling;
  } else {
    a.cos = cos_out->to(dt);
    a.sin = sin_out->to(dt);
  }
  return a;
}

void check_rope(const RopeCase& c) {
  auto op = registry().kernel<NormRope>("reference");
  at::Tensor cos, sin;
  NormRopeArgs a = build_rope(c, at::kDouble, &cos, &sin);
  at::Tensor x = leaf(a.x), w = leaf(a.weight);
  at::Tensor y = naive_norm_rope(x, w, a.eps, c.offset, cos.to(at::kDouble), sin.to(at::kDouble));
  at::Tensor got = op->forward(a);
  // computed rotations use fp32 inv_freq and fp32-exact positions: the angles agree to fp64 rounding
  CHECK(test::rel_err(got, y.detach()) < 1e-12);
  at::Tensor gy = at::randn(y.sizes(), at::kDouble);
  auto g = grads_of(y, gy, {x, w});
  NormRopeBackwardArgs b;
  b.grad_y = gy;
  NormRopeGrads r = op->backward(a, b);
  CHECK(test::rel_err(r.dx, g[0]) < 1e-12);
  CHECK(test::rel_err(r.dweight, g[1]) < 1e-12);
}

// ---- attention -------------------------------------------------------------------------------------

// One [T, Tk] mask over the whole packed batch: key j is visible to query i when both lie in the same
// sequence b, j <= i' (causal) and j >= i' − window, where i' = i + cu_k[b+1] − cu[b+1] is the key row query i
// is aligned with (bottom-right; i' = i without cu_k). A row that sees no key: out 0, lse −inf.
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<int>& cu,
                           double scale, bool causal, int64_t window, at::Tensor* lse, const at::Tensor& sinks = {},
                           std::vector<int> cu_k = {}) {
  if (cu_k.empty()) cu_k = cu;
  const int64_t T = q.size(0), Tk = k.size(0), Hq = q.size(1), G = Hq / k.size(1);
  at::Tensor seq = at::empty({T}, at::kLong), kseq = at::empty({Tk}, at::kLong), aligned = at::arange(T);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    seq.slice(0, cu[b], cu[b + 1]).fill_(static_cast<int64_t>(b));
    kseq.slice(0, cu_k[b], cu_k[b + 1]).fill_(static_cast<int64_t>(b));
    aligned.slice(0, cu[b], cu[b + 1]).add_(cu_k[b + 1] - cu[b + 1]);
  }
  at::Tensor i = aligned.unsqueeze(1), j = at::arange(Tk).unsqueeze(0);
  at::Tensor visible = seq.unsqueeze(1) == kseq.unsqueeze(0);
  if (causal) visible = visible & (j <= i);
  if (window >= 0) visible = visible & (j >= i - window);
  at::Tensor kk = k.repeat_interleave(G, 1), vv = v.repeat_interleave(G, 1);                // [Tk, Hq, *]
  at::Tensor scores = at::einsum("ihd,jhd->hij", {q, kk}) * scale;                            // [Hq, T, Tk]
  scores = scores.masked_fill(visible.logical_not(), -INFINITY);
  if (sinks.defined()) {
    // transformers' eager gpt_oss attention: the sink as one more column of the softmax, then dropped.
    at::Tensor full = at::cat({scores, sinks.view({Hq, 1, 1}).expand({Hq, T, 1})}, -1);
    *lse = at::logsumexp(full, -1);
    return at::einsum("hij,jhd->ihd", {at::softmax(full, -1).narrow(-1, 0, Tk), vv});
  }
  // Rows that see nothing get zero scores for the softmax (no NaN in autograd) and zero weights after it.
  const at::Tensor none = visible.any(-1).logical_not().unsqueeze(-1);                       // [T, 1]
  const at::Tensor safe = scores.masked_fill(none, 0.0);
  *lse = at::logsumexp(safe, -1).masked_fill(none.squeeze(-1), -INFINITY);
  return at::einsum("hij,jhd->ihd", {at::softmax(safe, -1).masked_fill(none, 0.0), vv});
}

struct AttnCase {
  std::vector<int> cu = {0, 5, 5, 6, 13};  // lengths 5, 0, 1, 7
  int64_t Hq = 4, Hkv = 2, D = 8, Dv = 6, window = -1;
  bool causal = true;
  double scale = 0.0;
  bool sinks = false;
  std::vector<int> cu_k = {};  // the keys' own boundaries (empty: cu)
};

AttentionArgs build_attn(const AttnCase& c, at::ScalarType dt) {
  at::manual_seed(11);
  const int64_t T = c.cu.back();
  AttentionArgs a;
  a.q = at::randn({T, c.Hq, c.D}, at::kDouble).to(dt);
  const int64_t Tk = c.cu_k.empty() ? T : c.cu_k.back();
  a.k = at::randn({Tk, c.Hkv, c.D}, at::kDouble).to(dt);
  a.v = at::randn({Tk, c.Hkv, c.Dv}, at::kDouble).to(dt);
  a.cu_seqlens = at::tensor(c.cu, at::kInt);
  if (!c.cu_k.empty()) a.cu_seqlens_k = at::tensor(c.cu_k, at::kInt);
  a.causal = c.causal;
  a.window_left = c.window;
  a.softmax_scale = c.scale;
  if (c.sinks) a.sinks = at::randn({c.Hq}, at::kFloat) * 2;
  return a;
}

void check_attn(const AttnCase& c) {
  auto op = registry().kernel<Attention>("reference");
  AttentionArgs a = build_attn(c, at::kDouble);
  at::Tensor q = leaf(a.q), k = leaf(a.k), v = leaf(a.v), lse;
  at::Tensor s = c.sinks ? leaf(a.sinks.to(at::kDouble)) : at::Tensor();
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  at::Tensor y = naive_attention(q, k, v, c.cu, scale, c.causal, c.window, &lse, s, c.cu_k);
  AttentionResult r = op->forward(a);
  CHECK(test::rel_err(r.out, y.detach()) < 1e-12);
  const at::Tensor none = lse.detach().isneginf();  // rows that see no key
  CHECK(at::equal(r.lse.isneginf(), none));
  CHECK(test::rel_err(r.lse.masked_fill(none, 0.0), lse.detach().masked_fill(none, 0.0)) < 1e-6);  // fp32 (contract)
  at::Tensor gy = at::randn(y.sizes(), at::kDouble);
  auto g = grads_of(y, gy, c.sinks ? std::vector<at::Tensor>{q, k, v, s} : std::vector<at::Tensor>{q, k, v});
  AttentionBackwardArgs b;
  b.grad_out = gy;
  b.out = r.out;
  b.lse = r.lse;
  AttentionGrads d = op->backward(a, b);
  CHECK(test::rel_err(d.dq, g[0]) < 1e-12);
  CHECK(test::rel_err(d.dk, g[1]) < 1e-12);
  CHECK(test::rel_err(d.dv, g[2]) < 1e-12);
  REQUIRE(d.dsinks.defined() == c.sinks);
  if (c.sinks) {
    CHECK((d.dsinks.scalar_type() == at::kFloat));
    CHECK(test::rel_err(d.dsinks, g[3]) < 1e-6);
  }
}

// ---- linear.lora -----------------------------------------------------------------------------------

LinearLoraArgs build_linear(at::ScalarType dt, bool nf4, bool lora, bool bias) {
  at::manual_seed(5);
  LinearLoraArgs a;
  a.x = at::randn({2, 3, 64}, at::kDouble).to(dt);
  at::Tensor w = at::randn({40, 64}, at::kDouble) / 8;
  a.weight = nf4 ? quantize_nf4(w.to(at::kFloat), 64, true) : WeightTensor::dense(w.to(dt));
  if (bias) a.bias = at::randn({40}, at::kDouble).to(dt);
  if (lora) {
    a.lora_a = (at::randn({6, 64}, at::kDouble) * 0.2).to(dt);
    a.lora_b = (at::randn({40, 6}, at::kDouble) * 0.2).to(dt);
    a.scaling = 2.0;
  }
  return a;
}

void check_linear(bool nf4, bool lora, bool bias) {
  auto op = registry().kernel<LinearLora>("reference");
  LinearLoraArgs a = build_linear(at::kDouble, nf4, lora, bias);
  at::Tensor x = leaf(a.x), W = dequantize(a.weight, at::kDouble);
  at::Tensor A = lora ? leaf(a.lora_a) : at::Tensor(), B = lora ? leaf(a.lora_b) : at::Tensor();
  at::Tensor y = at::einsum("bsk,nk->bsn", {x, W});
  if (bias) y = y + a.bias;
  if (lora) y = y + a.scaling * at::einsum("bsr,nr->bsn", {at::einsum("bsk,rk->bsr", {x, A}), B});
  CHECK(test::rel_err(op->forward(a), y.detach()) < 1e-12);
  at::Tensor gy = at::randn(y.sizes(), at::kDouble);
  std::vector<at::Tensor> in = {x};
  if (lora) in.insert(in.end(), {A, B});
  auto g = grads_of(y, gy, in);
  LinearLoraBackwardArgs b;
  b.grad_y = gy;
  LinearLoraGrads d = op->backward(a, b);
  CHECK(test::rel_err(d.dx, g[0]) < 1e-12);
  if (lora) {
    CHECK(test::rel_err(d.dlora_a, g[1]) < 1e-12);
    CHECK(test::rel_err(d.dlora_b, g[2]) < 1e-12);
  }
}

template <class F>
void expect_errors(const std::vector<std::pair<F, std::string>>& cases, const std::function<void(F&)>& run) {
  for (auto [f, want] : cases) {
    const std::string got = error_of([&] { run(f); });
    CAPTURE(want);
    CAPTURE(got);
    CHECK(got.find(want) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("norm_rope reference: formula and autograd (full, partial rotary, 1+w, computed cos/sin, [B,S] lead)") {
  check_rope({});
  check_rope({.R = 8});
  check_rope({.offset = true});
  check_rope({.computed = true});
  check_rope({.lead = {2, 5}, .H = 2, .D = 12, .R = 4, .offset = true, .computed = true});
  check_rope({.lead = {1}, .H = 1});
}

TEST_CASE("attention reference: formula, lse and autograd (GQA, MHA, MQA, window, non-causal, empty sequences)") {
  check_attn({});
  check_attn({.Hkv = 4});
  check_attn({.Hkv = 1, .Dv = 8});
  check_attn({.window = 2});
  check_attn({.causal = false, .scale = 0.3});
  check_attn({.cu = {0, 1}});
}

TEST_CASE("attention reference: sinks join each row's softmax (lse, out, dq/dk/dv and dsinks against the eager formula)") {
  check_attn({.sinks = true});
  check_attn({.Hkv = 1, .Dv = 8, .sinks = true});
  check_attn({.window = 2, .sinks = true});
  check_attn({.causal = false, .scale = 0.3, .sinks = true});
  check_attn({.cu = {0, 1}, .sinks = true});
}

// Query lengths 5, 0, 1, 7 against key lengths 8, 3, 0, 4: keys longer (offset rows), shorter (the first rows see
// nothing: out 0, lse -inf), keys without queries, a query without keys; a left-only window without causal.
TEST_CASE("attention reference: separate key boundaries, aligned bottom-right (causal, window, non-causal, sinks)") {
  const std::vector<int> cu_k = {0, 8, 11, 11, 15};
  check_attn({.cu_k = cu_k});
  check_attn({.Hkv = 1, .Dv = 8, .window = 2, .cu_k = cu_k});
  check_attn({.causal = false, .scale = 0.3, .cu_k = cu_k});
  check_attn({.window = 1, .causal = false, .cu_k = cu_k});
  check_attn({.sinks = true, .cu_k = cu_k});
  check_attn({.window = 0, .sinks = true, .cu_k = cu_k});
}

TEST_CASE("linear.lora reference: formula and autograd (dense and nf4, with and without LoRA and bias)") {
  check_linear(false, true, true);
  check_linear(true, true, false);
  check_linear(false, false, true);
  check_linear(true, true, true);
}

TEST_CASE("norm_rope/attention/linear.lora: bf16, fp16 and fp32 within the contract tolerance, deterministic") {
  const std::vector<std::pair<at::ScalarType, double>> tols = {{at::kFloat, 1e-5}, {at::kBFloat16, 2e-2}, {at::kHalf, 5e-3}};
  auto to64 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; };
  for (auto [dt, tol] : tols) {
    CAPTURE(std::string(at::toString(dt)));
    {
      auto op = registry().kernel<NormRope>("reference");
      at::Tensor c, s;
      NormRopeArgs a = build_rope({.R = 8, .offset = true}, dt, &c, &s), a64 = a;
      a64.x = to64(a.x), a64.weight = to64(a.weight), a64.cos = to64(a.cos), a64.sin = to64(a.sin);
      at::Tensor y = op->forward(a);
      CHECK(test::rel_err(y, op->forward(a64)) < tol);
      CHECK(test::bit_equal(y, op->forward(a)));
      NormRopeBackwardArgs b, b64;
      b.grad_y = at::randn(y.sizes()).to(dt);
      b64.grad_y = to64(b.grad_y);
      NormRopeGrads g = op->backward(a, b), g64 = op->backward(a64, b64);
      CHECK(test::rel_err(g.dx, g64.dx) < tol);
      CHECK(test::rel_err(g.dweight, g64.dweight) < tol);
      CHECK(test::bit_equal(g.dweight, op->backward(a, b).dweight));
    }
    {
      auto op = registry().kernel<Attention>("reference");
      AttentionArgs a = build_attn({}, dt), a64 = a;
      a64.q = to64(a.q), a64.k = to64(a.k), a64.v = to64(a.v);
      AttentionResult r = op->forward(a), r64 = op->forward(a64);
      CHECK(test::rel_err(r.out, r64.out) < tol);
      CHECK(test::bit_equal(r.out, op->forward(a).out));
      AttentionBackwardArgs b, b64;
      b.grad_out = at::randn(r.out.sizes()).to(dt);
      b.out = r.out;
      b.lse = r.lse;
      b64.grad_out = to64(b.grad_out);
      b64.out = r64.out;
      b64.lse = r64.lse;
      AttentionGrads g = op->backward(a, b), g64 = op->backward(a64, b64);
      CHECK(test::rel_err(g.dq, g64.dq) < tol);
      CHECK(test::rel_err(g.dk, g64.dk) < tol);
      CHECK(test::rel_err(g.dv, g64.dv) < tol);
      CHECK(test::bit_equal(g.dk, op->backward(a, b).dk));
    }
    {
      auto op = registry().kernel<LinearLora>("reference");
      LinearLoraArgs a = build_linear(dt, false, true, true), a64 = a;
      a64.x = to64(a.x), a64.weight = WeightTensor::dense(to64(a.weight.values));
      a64.lora_a = to64(a.lora_a), a64.lora_b = to64(a.lora_b), a64.bias = to64(a.bias);
      at::Tensor y = op->forward(a);
      CHECK(test::rel_err(y, op->forward(a64)) < tol);
      LinearLoraBackwardArgs b, b64;
      b.grad_y = at::randn(y.sizes()).to(dt);
      b64.grad_y = to64(b.grad_y);
      LinearLoraGrads g = op->backward(a, b), g64 = op->backward(a64, b64);
      CHECK(test::rel_err(g.dx, g64.dx) < tol);
      CHECK(test::rel_err(g.dlora_a, g64.dlora_a) < tol);
      CHECK(test::rel_err(g.dlora_b, g64.dlora_b) < tol);
      CHECK(test::bit_equal(g.dlora_b, op->backward(a, b).dlora_b));
    }
  }
}

TEST_CASE("norm_rope: bad input is rejected with the argument named") {
  auto op = registry().kernel<NormRope>("reference");
  using Mut = std::function<void(NormRopeArgs&)>;
  std::vector<std::pair<Mut, std::string>> cases = {
      {[](auto& a) { a.x = a.x[0][0]; }, "norm_rope: x: must be [..., heads, head_dim]"},
      {[](auto& a) { a.weight = a.weight.slice(0, 1); }, "norm_rope: weight: must have shape [16]"},
      {[](auto& a) { a.weight = a.weight.to(at::kFloat); }, "norm_rope: weight: must be fp64"},
      {[](auto& a) { a.cos = a.cos.slice(0, 1); }, "norm_rope: cos: must have shape [9, 16]"},
      {[](auto& a) { a.sin = at::Tensor(); }, "norm_rope: sin: is required"},
      {[](auto& a) { a.cos = a.cos.slice(1, 0, 3); a.sin = a.sin.slice(1, 0, 3); }, "norm_rope: cos: last dim (the rotary dim) must be even"},
      {[](auto& a) { a.position_ids = at::zeros({9}, at::kLong); }, "norm_rope: cos: give either cos/sin or position_ids/inv_freq"},
      {[](auto& a) { a.cos = a.sin = at::Tensor(); }, "norm_rope: cos: the rotation needs"},
      {[](auto& a) { a.cos = a.sin = at::Tensor(); a.position_ids = at::zeros({9}, at::kInt); a.inv_freq = at::ones({8}); },
       "norm_rope: position_ids: must be int64"},
      {[](auto& a) { a.cos = a.sin = at::Tensor(); a.position_ids = at::zeros({9}, at::kLong); a.inv_freq = at::ones({9}); },
       "norm_rope: inv_freq: must have 1..head_dim/2 = 8 entries"},
      {[](auto& a) { a.eps = -1; }, "norm_rope: eps: must be >= 0"},
      {[](auto& a) { a.out = at::empty({9, 3, 16}, at::kFloat); }, "norm_rope: out: must be fp64"},
  };
  expect_errors<Mut>(cases, [&](Mut& m) {
    at::Tensor c, s;
    NormRopeArgs a = build_rope({}, at::kDouble, &c, &s);
    m(a);
    op->forward(a);
  });
}

TEST_CASE("attention: bad input is rejected with the argument named") {
  auto op = registry().kernel<Attention>("reference");
  using Mut = std::function<void(AttentionArgs&)>;
  std::vector<std::pair<Mut, std::string>> cases = {
      {[](auto& a) { a.q = a.q[0]; }, "attention: q: must have 3 dims"},
      {[](auto& a) { a.k = a.k.slice(1, 0, 1).repeat({1, 3, 1}); a.v = a.v.slice(1, 0, 1).repeat({1, 3, 1}); },
       "attention: k: has 3 heads, which must divide q's 4 heads"},
      {[](auto& a) { a.k = a.k.slice(2, 1); }, "attention: k: must have shape [13, *, 8]"},
      {[](auto& a) { a.v = a.v.slice(0, 1); }, "attention: v: must have shape [13, 2, *]"},
      {[](auto& a) { a.v = a.v.to(at::kFloat); }, "attention: v: must be fp64"},
      {[](auto& a) { a.cu_seqlens = a.cu_seqlens.to(at::kLong); }, "attention: cu_seqlens: must be int32"},
      {[](auto& a) { a.cu_seqlens = at::tensor({0, 5, 12}, at::kInt); }, "attention: cu_seqlens: must end at the token count 13, got 12"},
      {[](auto& a) { a.cu_seqlens = at::tensor({0, 6, 5, 13}, at::kInt); }, "attention: cu_seqlens: must be nondecreasing"},
      {[](auto& a) { a.cu_seqlens = at::tensor({1, 13}, at::kInt); }, "attention: cu_seqlens: must start at 0"},
      {[](auto& a) { a.max_seqlen = 3; }, "attention: max_seqlen: is 3 but the longest sequence has 7 tokens"},
      {[](auto& a) { a.max_seqlen_k = 4; }, "attention: max_seqlen_k: is given without cu_seqlens_k"},
      {[](auto& a) { a.cu_seqlens_k = at::tensor({0, 13}, at::kInt); },
       "attention: cu_seqlens_k: has 2 entries, cu_seqlens 5: one boundary per sequence on both sides"},
      {[](auto& a) { a.cu_seqlens_k = at::tensor({0, 5, 12}, at::kInt); }, "attention: cu_seqlens_k: must end at the row count 13, got 12"},
      {[](auto& a) { a.cu_seqlens_k = at::tensor({0, 6, 6, 6, 13}, at::kInt); a.max_seqlen_k = 6; },
       "attention: max_seqlen_k: is 6 but the longest key sequence has 7 rows"},
      {[](auto& a) { a.cu_seqlens_k = a.cu_seqlens; a.groups = at::zeros({13}, at::kInt); },
       "attention: cu_seqlens_k: is not taken with bidirectional groups"},
      {[](auto& a) { a.out = at::empty({13, 4, 8}, at::kDouble); }, "attention: out: must have shape [13, 4, 6]"},
      {[](auto& a) { a.sinks = at::zeros({2}, at::kFloat); }, "attention: sinks: must have shape [4]"},
      {[](auto& a) { a.sinks = at::zeros({4}, at::kDouble); }, "attention: sinks: must be fp32"},
  };
  expect_errors<Mut>(cases, [&](Mut& m) {
    AttentionArgs a = build_attn({}, at::kDouble);
    m(a);
    op->forward(a);
  });
  AttentionArgs a = build_attn({}, at::kDouble);
  AttentionResult r = op->forward(a);
  AttentionBackwardArgs b;
  b.grad_out = at::zeros_like(r.out);
  b.out = r.out;
  CHECK(error_of([&] { op->backward(a, b); }).find("attention: lse: is required") != std::string::npos);
}

TEST_CASE("linear.lora: bad input is rejected with the argument named") {
  auto op = registry().kernel<LinearLora>("reference");
  using Mut = std::function<void(LinearLoraArgs&)>;
  std::vector<std::pair<Mut, std::string>> cases = {
      {[](auto& a) { a.x = a.x.slice(2, 1); }, "linear.lora: weight: has K = 64"},
      {[](auto& a) { a.weight = quantize_mxfp4(at::randn({64, 64}), 0); }, "linear.lora: weight.axis: mxfp4 blocks must run along K"},
      {[](auto& a) { a.weight = WeightTensor::dense(a.weight.values.unsqueeze(0)); }, "linear.lora: weight: must be 2-dim"},
      {[](auto& a) { a.bias = a.bias.slice(0, 1); }, "linear.lora: bias: must have shape [40]"},
      {[](auto& a) { a.lora_a = at::Tensor(); }, "linear.lora: lora_a: LoRA needs both"},
      {[](auto& a) { a.lora_b = a.lora_b.t(); }, "linear.lora: lora_b: must have shape [40, 6]"},
      {[](auto& a) { a.lora_b = a.lora_b.to(at::Device("meta")); }, "linear.lora: lora_b: is on meta but x is on cpu"},
      {[](auto& a) { a.weight.values = a.weight.values.to(at::kBFloat16); a.weight.shape = {40, 64}; },
       "linear.lora: weight: must have x's dtype fp64"},
  };
  expect_errors<Mut>(cases, [&](Mut& m) {
    LinearLoraArgs a = build_linear(at::kDouble, false, true, true);
    m(a);
    op->forward(a);
  });
  LinearLoraArgs a = build_linear(at::kDouble, false, true, true);
  LinearLoraBackwardArgs b;
  b.grad_y = at::zeros({2, 3, 41}, at::kDouble);
  CHECK(error_of([&] { op->backward(a, b); }).find("linear.lora: grad_y: must have shape [2, 3, 40]") != std::string::npos);
}

TEST_CASE("norm_rope reference matches transformers (Qwen3 q-norm + RoPE, Qwen3-Next 1+w + partial rotary)") {
  // goldens: scripts/goldens/make_op_goldens.py (transformers' own RMSNorm, rotary embedding and
  // apply_rotary_pos_emb, fp32, autograd for the gradients)
  auto g = test::load_safetensors(test::data_path("ops/norm_rope.safetensors"));
  auto op = registry().kernel<NormRope>("reference");
  for (std::string m : {"qwen3", "qwen3_next"}) {
    for (bool computed : {false, true}) {
      CAPTURE(m);
      CAPTURE(computed);
      NormRopeArgs a;
      a.x = g[m + "_x"];
      a.weight = g[m + "_weight"];
      a.eps = g[m + "_eps"][0].item<double>();
      a.weight_offset = m == "qwen3_next";
      if (computed) {
        a.position_ids = g[m + "_position_ids"];
        a.inv_freq = g[m + "_inv_freq"];
        a.attention_scaling = g[m + "_attention_scaling"][0].item<double>();
      } else {
        a.cos = g[m + "_cos"];
        a.sin = g[m + "_sin"];
      }
      CHECK(test::rel_err(op->forward(a), g[m + "_y"]) < 1e-5);
      NormRopeBackwardArgs b;
      b.grad_y = g[m + "_grad_y"];
      NormRopeGrads d = op->backward(a, b);
      CHECK(test::rel_err(d.dx, g[m + "_dx"]) < 1e-5);
      CHECK(test::rel_err(d.dweight, g[m + "_dweight"]) < 1e-5);
    }
  }
}
