// Conformance cases for attention (docs/ops/attention.md): out, lse and dq, dk, dv against the reference
// over packed variable-length batches (incl. length-1 sequences), GQA / MQA / MHA, sliding windows,
// non-causal, Dv != D, non-contiguous q/k/v (slices of a fused qkv), guarded outputs.
#include "axengine/ops/attention.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::Attention;
using ops::AttentionArgs;
using ops::AttentionBackwardArgs;
using ops::AttentionGrads;

struct Shape {
  std::vector<int64_t> seqlens;
  int64_t Hq, Hkv, D, Dv;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : seqlens) d.push_back(std::to_string(v));
    return ax::str("seqlens=", join(d, "+"), ",", kv({{"Hq", Hq}, {"Hkv", Hkv}, {"D", D}, {"Dv", Dv}}));
  }
  int64_t T() const {
    int64_t t = 0;
    for (auto v : seqlens) t += v;
    return t;
  }
};

struct Variant {
  bool causal = true;
  int64_t window = -1;
  bool noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{causal ? "causal" : "noncausal"};
    if (window >= 0) p.push_back(ax::str("window=", window));
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

struct Problem {
  at::Tensor q, k, v, cu, grad;
};

Problem make_problem(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  Problem p;
  const int64_t T = s.T();
  p.q = at::randn({T, s.Hq, s.D}, g, at::kFloat);
  p.k = at::randn({T, s.Hkv, s.D}, g, at::kFloat);
  p.v = at::randn({T, s.Hkv, s.Dv}, g, at::kFloat);
  std::vector<int32_t> cu{0};
  for (auto l : s.seqlens) cu.push_back(cu.back() + static_cast<int32_t>(l));
  p.cu = at::tensor(cu, at::kInt);
  p.grad = at::randn({T, s.Hq, s.Dv}, g, at::kFloat);
  return p;
}

AttentionArgs make_args(const Problem& p, const Shape& s, const Variant& v, at::ScalarType dt, at::Device dev,
                        bool noncontig) {
  AttentionArgs a;
  if (noncontig) {
    // q, k, v as slices of one fused projection output, as attention layers produce them.
    at::Tensor fused = at::cat({p.q.flatten(1), p.k.flatten(1), p.v.flatten(1)}, 1).to(dev, dt);
    const int64_t nq = s.Hq * s.D, nk = s.Hkv * s.D;
    a.q = fused.narrow(1, 0, nq).unflatten(1, {s.Hq, s.D});
    a.k = fused.narrow(1, nq, nk).unflatten(1, {s.Hkv, s.D});
    a.v = fused.narrow(1, nq + nk, s.Hkv * s.Dv).unflatten(1, {s.Hkv, s.Dv});
  } else {
    a.q = p.q.to(dev, dt);
    a.k = p.k.to(dev, dt);
    a.v = p.v.to(dev, dt);
  }
  a.cu_seqlens = p.cu.to(dev);
  a.causal = v.causal;
  a.window_left = v.window;
  return a;
}

AttentionGrads fwd_bwd(Attention& op, const AttentionArgs& a, const at::Tensor& grad, AttentionGrads out = {}) {
  auto r = op.forward(a);
  AttentionBackwardArgs b;
  b.grad_out = grad;
  b.out = r.out;
  b.lse = r.lse;
  b.saved = r.saved;
  b.grads_out = out;
  return op.backward(a, b);
}

void case_pair(CaseRunner& cases, const std::string& dtype, const Shape& s, const Variant& v) {
  const Target& T = cases.target();
  for (const char* phase : {"fwd", "bwd"}) {
    const std::string name = ax::str("attention/", phase, "/", dtype, "/", s.name(), "/", v.name());
    cases.run(name, [&, phase = std::string(phase)] {
      const at::ScalarType dt = scalar_type(dtype);
      Problem p = make_problem(s, name, T.seed);
      AttentionArgs ra = make_args(p, s, v, dt, T.reference_device, false);
      AttentionArgs ia = make_args(p, s, v, dt, T.device, v.noncontig);
      InputGuard guard;
      guard.add("q", ia.q);
      guard.add("k", ia.k);
      guard.add("v", ia.v);
      guard.add("cu_seqlens", ia.cu_seqlens);
      std::vector<std::string> msgs;
      if (phase == "fwd") {
        auto want = T.ref<Attention>().forward(ra);
        std::optional<GuardedOut> out;
        if (v.out) {
          out.emplace(want.out.sizes(), dt, T.device);
          ia.out = out->view();
        }
        auto got = T.impl<Attention>().forward(ia);
        if (out) msgs.push_back(out->check("out", got.out));
        msgs.push_back(check_close("out", got.out, want.out.to(T.device), tolerance(dtype).forward));
        msgs.push_back(check_close("lse", got.lse, want.lse.to(T.device), kLseTolerance));
      } else {
        at::Tensor grad = p.grad.to(dt);
        AttentionGrads want = fwd_bwd(T.ref<Attention>(), ra, grad.to(T.reference_device));
        AttentionGrads preset;
        std::optional<GuardedOut> oq, ok, ov;
        if (v.out) {
          oq.emplace(ia.q.sizes(), dt, T.device);
          ok.emplace(ia.k.sizes(), dt, T.device);
          ov.emplace(ia.v.sizes(), dt, T.device);
          preset.dq = oq->view();
          preset.dk = ok->view();
          preset.dv = ov->view();
        }
        at::Tensor ig = v.noncontig ? non_contiguous(grad.to(T.device)) : grad.to(T.device);
        guard.add("grad_out", ig);
        AttentionGrads got = fwd_bwd(T.impl<Attention>(), ia, ig, preset);
        if (oq) msgs.push_back(oq->check("dq", got.dq));
        if (ok) msgs.push_back(ok->check("dk", got.dk));
        if (ov) msgs.push_back(ov->check("dv", got.dv));
        const double tol = tolerance(dtype).attention_backward;
        // dq and dk vanish by cancellation where a query sees a single key; dv sets their scale.
        const double dv_scale = want.dv.to(at::kDouble).norm().item<double>();
        msgs.push_back(check_close("dq", got.dq, want.dq.to(T.device), tol, dv_scale));
        msgs.push_back(check_close("dk", got.dk, want.dk.to(T.device), tol, dv_scale));
        msgs.push_back(check_close("dv", got.dv, want.dv.to(T.device), tol));
      }
      msgs.push_back(guard.check());
      return join(msgs, "; ");
    });
  }
}

void determinism_case(CaseRunner& cases, const std::string& dtype) {
  const Target& T = cases.target();
  const Shape s{{40, 24}, 8, 2, 32, 32};
  const std::string name = ax::str("attention/determinism/", dtype, "/", s.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(dtype);
    Problem p = make_problem(s, name, T.seed);
    AttentionArgs a = make_args(p, s, {}, dt, T.device, false);
    at::Tensor grad = p.grad.to(T.device, dt);
    auto& op = T.impl<Attention>();
    auto r1 = op.forward(a), r2 = op.forward(a);
    AttentionGrads g1 = fwd_bwd(op, a, grad), g2 = fwd_bwd(op, a, grad);
    return join({check_bitwise("out", r1.out, r2.out), check_bitwise("lse", r1.lse, r2.lse),
                 check_bitwise("dq", g1.dq, g2.dq), check_bitwise("dk", g1.dk, g2.dk), check_bitwise("dv", g1.dv, g2.dv)},
                "; ");
  });
}

void bad_input_cases(CaseRunner& cases, const std::string& dtype) {
  const Target& T = cases.target();
  const Shape s{{3, 4}, 4, 2, 16, 16};
  const std::string pre = ax::str("attention/badinput/", dtype);
  const at::ScalarType dt = scalar_type(dtype);
  Problem p = make_problem(s, pre, T.seed);
  const AttentionArgs good = make_args(p, s, {}, dt, T.device, false);
  auto fwd = [&](const AttentionArgs& a) { T.impl<Attention>().forward(a); };
  auto opt = at::TensorOptions().device(T.device);
  struct Bad {
    std::string what, argument;
    std::function<void()> fn;
  };
  std::vector<Bad> bad = {
      {"heads_not_divisible", "k", [&] { auto a = good; a.k = at::zeros({7, 3, 16}, opt.dtype(dt)); a.v = at::zeros({7, 3, 16}, opt.dtype(dt)); fwd(a); }},
      {"k_head_dim", "k", [&] { auto a = good; a.k = a.k.narrow(2, 0, 15); fwd(a); }},
      {"v_rows", "v", [&] { auto a = good; a.v = a.v.narrow(0, 0, 6); fwd(a); }},
      {"q_dtype", "q", [&] { auto a = good; a.q = a.q.to(at::kInt); fwd(a); }},
      {"cu_seqlens_dtype", "cu_seqlens", [&] { auto a = good; a.cu_seqlens = a.cu_seqlens.to(at::kFloat); fwd(a); }},
      {"cu_seqlens_total", "cu_seqlens",
       [&] { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 3, 6}, opt.dtype(at::kInt)); fwd(a); }},
      {"cu_seqlens_decreasing", "cu_seqlens",
       [&] { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 5, 3, 7}, opt.dtype(at::kInt)); fwd(a); }},
      {"out_shape", "out", [&] { auto a = good; a.out = at::empty({7, 4, 15}, opt.dtype(dt)); fwd(a); }},
      {"grad_out_shape", "grad_out",
       [&] {
         auto r = T.impl<Attention>().forward(good);
         AttentionBackwardArgs b;
         b.grad_out = at::zeros({7, 4, 17}, opt.dtype(dt));
         b.out = r.out;
         b.lse = r.lse;
         b.saved = r.saved;
         T.impl<Attention>().backward(good, b);
       }},
  };
  for (auto& b : bad) cases.run(ax::str(pre, "/", b.what), [&] { return check_throws_naming(b.argument, b.fn); });
}

}  // namespace

void run_attention(CaseRunner& cases) {
  const Target& T = cases.target();
  std::vector<Shape> shapes = {
      {{5, 1, 11}, 4, 2, 16, 16},  // GQA, a length-1 sequence, T=17
      {{1}, 2, 2, 8, 8},           // T=1, MHA
      {{9, 4}, 6, 1, 20, 12},      // MQA, Dv != D, no power-of-two head dim
      {{33, 0, 32}, 3, 3, 64, 64}, // an empty sequence inside the batch
  };
  if (!T.quick) shapes.push_back({{130, 65, 1, 64}, 8, 2, 128, 128});
  const std::vector<Variant> vs = {{}, {.causal = true, .window = 3}, {.causal = false},
                                   {.causal = true, .window = -1, .noncontig = true, .out = true}};
  for (const auto& dtype : T.dtypes) {
    for (const auto& s : shapes)
      for (const auto& v : vs) case_pair(cases, dtype, s, v);
    determinism_case(cases, dtype);
    bad_input_cases(cases, dtype);
  }
}

}  // namespace ax::conformance::detail
