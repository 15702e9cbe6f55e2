// The conformance problems of attention (docs/ops/attention.md): out, lse and dq, dk, dv against the
// reference over packed variable-length batches (incl. length-1 sequences), GQA / MQA / MHA, sliding
// windows, non-causal, Dv != D (MLA's 192/128 among them), non-contiguous q/k/v (slices of a fused qkv), preallocated outputs;
// keys with their own boundaries (cu_seqlens_k: longer and shorter than the queries, aligned bottom-right, rows
// that see no key, sequences empty on one side: ring attention's blocks), left-only windows without causal;
// attention sinks (out, lse and dsinks too) for backends claiming the layout "sinks"; determinism and bad
// input. The checks are the suite's generic ones (suite.cpp); dq and dk's closeness
// where they vanish by cancellation is this op's own.
#include <algorithm>

#include "axengine/ops/attention.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::Attention;
using ops::AttentionArgs;
using ops::AttentionBackwardArgs;
using ops::AttentionGrads;

int64_t total(const std::vector<int64_t>& lengths) {
  int64_t t = 0;
  for (auto v : lengths) t += v;
  return t;
}
std::string lengths_name(const std::vector<int64_t>& lengths) {
  std::vector<std::string> d;
  for (auto v : lengths) d.push_back(std::to_string(v));
  return join(d, "+");
}

struct Shape {
  std::vector<int64_t> seqlens;
  int64_t Hq, Hkv, D, Dv;
  std::vector<int64_t> kseqlens = {};  // the keys' own lengths (cu_seqlens_k); empty: the queries'
  std::string name() const {
    const std::string k = kseqlens.empty() ? "" : ax::str(",kseqlens=", lengths_name(kseqlens));
    return ax::str("seqlens=", lengths_name(seqlens), k, ",", kv({{"Hq", Hq}, {"Hkv", Hkv}, {"D", D}, {"Dv", Dv}}));
  }
  int64_t T() const { return total(seqlens); }
  int64_t Tk() const { return kseqlens.empty() ? T() : total(kseqlens); }
};

struct Variant {
  bool causal = true;
  int64_t window = -1;
  bool noncontig = false, out = false;
  bool sinks = false;
  // The engine always passes the longest length (graph-safe backends need it: deriving it is a sync);
  // max_seqlen = 0 (the op derives it) is the contract's other form, tested on the non-causal variants.
  bool max_seqlen_given = true;
  std::string name() const {
    std::vector<std::string> p{causal ? "causal" : "noncausal"};
    if (!max_seqlen_given) p.push_back("max_seqlen=0");
    if (window >= 0) p.push_back(ax::str("window=", window));
    if (sinks) p.push_back("sinks");
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

struct Data {
  at::Tensor q, k, v, cu, cuk, grad, sinks;
};

at::Tensor offsets(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (auto l : lengths) cu.push_back(cu.back() + static_cast<int32_t>(l));
  return at::tensor(cu, at::kInt);
}

Data make_data(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  Data p;
  const int64_t T = s.T();
  p.q = at::randn({T, s.Hq, s.D}, g, at::kFloat);
  p.k = at::randn({s.Tk(), s.Hkv, s.D}, g, at::kFloat);
  p.v = at::randn({s.Tk(), s.Hkv, s.Dv}, g, at::kFloat);
  p.cu = offsets(s.seqlens);
  if (!s.kseqlens.empty()) p.cuk = offsets(s.kseqlens);
  p.grad = at::randn({T, s.Hq, s.Dv}, g, at::kFloat);
  // Sinks around the scores' own size (|S| ~ 1 here): large enough that a backend ignoring them, or
  // adding them to lse without rescaling out, is far outside every tolerance; some heads dominated by the
  // sink, some barely touched.
  p.sinks = at::randn({s.Hq}, g, at::kFloat) * 2.0;
  return p;
}

AttentionArgs make_args(const Data& p, const Shape& s, const Variant& v, at::ScalarType dt, at::Device dev,
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
  if (v.max_seqlen_given) a.max_seqlen = std::max<int64_t>(1, *std::max_element(s.seqlens.begin(), s.seqlens.end()));
  if (p.cuk.defined()) {
    a.cu_seqlens_k = p.cuk.to(dev);
    if (v.max_seqlen_given) a.max_seqlen_k = std::max<int64_t>(1, *std::max_element(s.kseqlens.begin(), s.kseqlens.end()));
  }
  a.causal = v.causal;
  a.window_left = v.window;
  if (v.sinks) a.sinks = p.sinks.to(dev);  // fp32 whatever the dtype (the contract)
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

// phase "fwd": out, lse; "bwd": dq, dk, dv; "fwd+bwd": all (determinism).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = phase == "fwd+bwd" ? ax::str(dtype, "/", s.name(), v.sinks ? "/sinks" : "")
                              : ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("attention/", phase == "fwd+bwd" ? "determinism" : phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, b.draw ? key + "#1" : key, seed);  // the same sequence lengths in every draw
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<AttentionArgs>(make_args(d, s, v, dt, b.device, noncontig));
    args->check_values = !b.for_graph;  // the value checks read cu_seqlens on the host
    at::Tensor grad = d.grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    Call c;
    c.inputs = {{"q", args->q}, {"k", args->k}, {"v", args->v}, {"cu_seqlens", args->cu_seqlens}};
    if (args->cu_seqlens_k.defined()) c.inputs.emplace_back("cu_seqlens_k", args->cu_seqlens_k);
    if (args->sinks.defined()) c.inputs.emplace_back("sinks", args->sinks);
    if (phase != "fwd") c.inputs.emplace_back("grad_out", grad);
    c.run = [args, grad, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<Attention>();
      // A call the backend declines goes to the next backend in the engine: nothing of this one to certify.
      if (auto why = op.decline(*args)) skip(ax::str("the backend declines this call: ", *why));
      Tensors res;
      if (phase != "bwd") {
        AttentionArgs a = *args;
        a.out = output(out, "out");
        auto r = op.forward(a);
        res.insert(res.end(), {{"out", r.out}, {"lse", r.lse}});
      }
      if (phase != "fwd") {
        AttentionGrads preset{output(out, "dq"), output(out, "dk"), output(out, "dv"), {}};
        if (args->sinks.defined()) preset.dsinks = output(out, "dsinks");
        AttentionGrads g = fwd_bwd(op, *args, grad, preset);
        res.insert(res.end(), {{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}});
        if (args->sinks.defined()) res.emplace_back("dsinks", g.dsinks);
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  if (phase == "fwd" && !s.kseqlens.empty()) {
    // Rows that see no key have lse -inf: the same rows must, and the others are compared as usual.
    p.compare = {{"out", tol.forward}};
    p.extra = [](const Tensors& got, const Tensors& want) {
      const at::Tensor g = output(got, "lse"), w = output(want, "lse");
      if (!g.defined() || g.sizes() != w.sizes()) return check_close("lse", g, w, kLseTolerance);  // names the fault
      const at::Tensor none = w.isneginf();
      if (!at::equal(g.isneginf(), none)) fail("lse: -inf (a row that sees no key) on other rows than the reference's");
      return check_close("lse", g.masked_fill(none, 0.0), w.masked_fill(none, 0.0), kLseTolerance);
    };
    if (v.out) p.preallocated = {"out"};
  } else if (phase == "fwd") {
    p.compare = {{"out", tol.forward}, {"lse", kLseTolerance}};
    if (v.out) p.preallocated = {"out"};
  } else if (phase == "bwd") {
    p.compare = {{"dv", tol.backward}};
    if (v.sinks) p.compare.emplace_back("dsinks", tol.backward);
    if (v.out) p.preallocated = {"dq", "dk", "dv"};
    if (v.out && v.sinks) p.preallocated.push_back("dsinks");
    const double t = tol.backward;
    p.extra = [t](const Tensors& got, const Tensors& want) {
      // dq and dk vanish by cancellation where a query sees a single key; dv sets their scale.
      const double dv_scale = output(want, "dv").to(at::kDouble).norm().item<double>();
      return join({check_close("dq", output(got, "dq"), output(want, "dq"), t, dv_scale),
                   check_close("dk", output(got, "dk"), output(want, "dk"), t, dv_scale)},
                  "; ");
    };
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{{3, 4}, 4, 2, 16, 16};
  const at::ScalarType dt = scalar_type(dtype);
  Data p = make_data(s, ax::str("attention/badinput/", dtype), suite.seed());
  const AttentionArgs good = make_args(p, s, {}, dt, suite.device(), false);
  auto fwd = [](const Backend& be, const AttentionArgs& a) { be.as<Attention>().forward(a); };
  auto opt = at::TensorOptions().device(suite.device());
  using B = const Backend&;
  return {
      {"heads_not_divisible", "k", [=](B be) { auto a = good; a.k = at::zeros({7, 3, 16}, opt.dtype(dt)); a.v = at::zeros({7, 3, 16}, opt.dtype(dt)); fwd(be, a); }},
      {"k_head_dim", "k", [=](B be) { auto a = good; a.k = a.k.narrow(2, 0, 15); fwd(be, a); }},
      {"v_rows", "v", [=](B be) { auto a = good; a.v = a.v.narrow(0, 0, 6); fwd(be, a); }},
      {"q_dtype", "q", [=](B be) { auto a = good; a.q = a.q.to(at::kInt); fwd(be, a); }},
      {"cu_seqlens_dtype", "cu_seqlens", [=](B be) { auto a = good; a.cu_seqlens = a.cu_seqlens.to(at::kFloat); fwd(be, a); }},
      {"cu_seqlens_total", "cu_seqlens",
       [=](B be) { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 3, 6}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"cu_seqlens_decreasing", "cu_seqlens",
       [=](B be) { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 5, 3, 7}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"cu_seqlens_k_count", "cu_seqlens_k",
       [=](B be) { auto a = good; a.cu_seqlens_k = at::tensor(std::vector<int32_t>{0, 7}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"cu_seqlens_k_total", "cu_seqlens_k",
       [=](B be) { auto a = good; a.cu_seqlens_k = at::tensor(std::vector<int32_t>{0, 3, 6}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"max_seqlen_k_alone", "max_seqlen_k", [=](B be) { auto a = good; a.max_seqlen_k = 4; fwd(be, a); }},
      {"sinks_shape", "sinks", [=](B be) { auto a = good; a.sinks = at::zeros({3}, opt.dtype(at::kFloat)); fwd(be, a); }},
      {"sinks_dtype", "sinks", [=](B be) { auto a = good; a.sinks = at::zeros({4}, opt.dtype(dt == at::kFloat ? at::kHalf : dt)); fwd(be, a); }},
      {"out_shape", "out", [=](B be) { auto a = good; a.out = at::empty({7, 4, 15}, opt.dtype(dt)); fwd(be, a); }},
      {"grad_out_shape", "grad_out",
       [=](B be) {
         auto& op = be.as<Attention>();
         auto r = op.forward(good);
         AttentionBackwardArgs b;
         b.grad_out = at::zeros({7, 4, 17}, opt.dtype(dt));
         b.out = r.out;
         b.lse = r.lse;
         b.saved = r.saved;
         op.backward(good, b);
       }},
  };
}

}  // namespace

void attention_problems(Suite& suite) {
  std::vector<Shape> shapes = {
      {{5, 1, 11}, 4, 2, 16, 16},  // GQA, a length-1 sequence, T=17
      {{1}, 2, 2, 8, 8},           // T=1, MHA
      {{9, 4}, 6, 1, 20, 12},      // MQA, Dv != D, no power-of-two head dim
      {{33, 0, 32}, 3, 3, 64, 64}, // an empty sequence inside the batch
      {{7, 1, 12}, 4, 4, 192, 128},  // MLA (DeepSeek-V3): qk 192 = nope 128 + rope 64, v 128; packed rows
  };
  if (!suite.quick()) shapes.push_back({{130, 65, 1, 64}, 8, 2, 128, 128});
  // Keys with their own boundaries, as ring attention's blocks have them: longer keys (offset queries), shorter keys
  // (leading rows that see nothing), a sequence without queries and one without keys; GQA, Dv != D.
  const std::vector<Shape> key_shapes = {
      {{5, 0, 3, 7}, 4, 2, 16, 16, {9, 4, 0, 3}},
      {{6, 2}, 6, 1, 20, 12, {2, 11}},
  };
  std::vector<Variant> vs = {{}, {.causal = true, .window = 3}, {.causal = false, .max_seqlen_given = false},
                             {.causal = true, .window = -1, .noncontig = true, .out = true}, {.causal = false, .window = 2}};
  // Sink variants only for backends that claim them (a backend listing no layouts claims every one).
  if (suite.claims_layout("sinks"))
    for (Variant v : {Variant{.sinks = true}, Variant{.window = 3, .sinks = true},
                      Variant{.noncontig = true, .out = true, .sinks = true}})
      vs.push_back(v);
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], vs[j]);
          p.graph = i == 0 && (j == 0 || j == 3);
          suite.accuracy(p);
        }
    for (const Shape& s : key_shapes)
      for (const Variant& v : vs)
        if (!v.noncontig)  // the fused-qkv slices need one row count for q, k and v
          for (const char* phase : {"fwd", "bwd"}) suite.accuracy(problem(suite, phase, dtype, s, v));
    suite.determinism(problem(suite, "fwd+bwd", dtype, {{40, 24}, 8, 2, 32, 32}, {}));
    if (suite.claims_layout("sinks"))
      suite.determinism(problem(suite, "fwd+bwd", dtype, {{40, 24}, 8, 2, 32, 32}, {.sinks = true}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
