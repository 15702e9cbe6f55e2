// The conformance problems of moe.mlp (docs/ops/moe.mlp.md): forward y and backward dx, the four LoRA
// factor grads and dgates against the reference, over moe.experts' routing edge cases (-1 entries inside
// ranges and after the last offset, empty experts), both activations and packings, both layouts, every
// claimed weight format; preallocated outputs; determinism; repeatability; bad input. Each fp32 problem is
// also checked against an independent oracle (fp64, per-entry, autograd through plain ATen), so the
// reference itself is tested, and tokens whose every entry is inactive must get exactly zero y and dx.
#include <map>

#include <ATen/ATen.h>

#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::ExpertLayout;
using ops::GluPacking;
using ops::MoeActivation;
using ops::MoeMlp;
using ops::MoeMlpArgs;
using ops::MoeMlpBackwardArgs;
using ops::MoeMlpGrads;

constexpr double kScalingUp = 0.75, kScalingDown = 1.25;  // never 1, never equal: each must show
constexpr double kLimit = 1.25;  // small enough that the clamps bite on unit-scale pre-activations

struct Shape {
  int64_t E, k, T, H, I, r;
  std::string routing = "random";
  std::string name() const {
    std::string s = kv({{"E", E}, {"k", k}, {"T", T}, {"H", H}, {"I", I}, {"r", r}});
    return routing == "random" ? s : s + "," + routing;
  }
};

struct Variant {
  MoeActivation act = MoeActivation::silu_glu;
  GluPacking packing = GluPacking::halves;
  bool lora_up = true, lora_down = true, bias = false, noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{ops::to_string(act), ops::to_string(packing)};
    p.push_back(lora_up && lora_down ? "lora" : lora_up ? "lora_up" : lora_down ? "lora_down" : "nolora");
    if (bias) p.push_back("bias");
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

const std::vector<Variant>& all_variants() {
  static const std::vector<Variant> v = {
      {.bias = true},
      {.act = MoeActivation::clamped_glu, .packing = GluPacking::interleaved, .bias = true},  // gpt-oss
      {.lora_up = false, .lora_down = false},
      // clamped_glu problems carry biases: keep_off_kinks moves the pre-activations through them.
      {.act = MoeActivation::clamped_glu, .packing = GluPacking::halves, .lora_down = false, .bias = true},
      {.packing = GluPacking::interleaved, .lora_up = false, .bias = true, .noncontig = true, .out = true},
      {.act = MoeActivation::clamped_glu, .packing = GluPacking::interleaved, .bias = true, .noncontig = true, .out = true},
  };
  return v;
}

// One problem's data in fp32 on the CPU; the weights in EKN orientation (w1 [E, H, 2I], w2 [E, I, H]).
struct Data {
  Shape s;
  ExpertLayout layout;
  at::Tensor x, w1, w2, a1, b1, a2, b2, bias1, bias2, gates, grad;
  ops::MoeRouting routing;
};

Data make_data(const Shape& s, ExpertLayout layout, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  auto f32 = at::TensorOptions().dtype(at::kFloat);
  Data d{s, layout};
  d.routing = moe_test_routing(s.E, s.k, s.T, s.routing, g);
  d.x = at::randn({s.T, s.H}, g, f32);
  // Weights by shape only (their own generator), so quantised copies are shared across a shape's cases.
  at::Generator gw = case_generator(seed, "moe.mlp/weight/" + s.name());
  d.w1 = at::randn({s.E, s.H, 2 * s.I}, gw, f32) / std::sqrt(static_cast<double>(s.H));
  d.w2 = at::randn({s.E, s.I, s.H}, gw, f32) / std::sqrt(static_cast<double>(s.I));
  const double sr = std::sqrt(static_cast<double>(s.r));
  d.a1 = at::randn({s.r * s.E, s.H}, g, f32) / std::sqrt(static_cast<double>(s.H));
  d.b1 = at::randn({2 * s.I, s.r * s.E}, g, f32) / sr;
  d.a2 = at::randn({s.r * s.E, s.I}, g, f32) / std::sqrt(static_cast<double>(s.I));
  d.b2 = at::randn({s.H, s.r * s.E}, g, f32) / sr;
  d.bias1 = at::randn({s.E, 2 * s.I}, g, f32) * 0.5;
  d.bias2 = at::randn({s.E, s.H}, g, f32) * 0.5;
  d.gates = at::rand({s.T, s.k}, g, f32) + 0.1;
  d.grad = at::randn({s.T, s.H}, g, f32);
  return d;
}

// Quantised weights of the current target, by (shape, projection, layout, format, dtype); cleared per target.
std::map<std::string, ops::WeightTensor>& weight_cache() {
  static std::map<std::string, ops::WeightTensor> cache;
  return cache;
}

// A weight in the problem's layout and format. The blocked axis of mxfp4/nvfp4 is K (dim 1 EKN, 2 ENK).
ops::WeightTensor weight_for(const Data& d, bool down, const std::string& variant, at::ScalarType dt) {
  const std::string key = ax::str(d.s.name(), down ? "/down/" : "/gate_up/", ops::to_string(d.layout), "/", variant, "/",
                                  variant == "dense" ? dtype_name(dt) : std::string("any"));
  auto& cache = weight_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    const at::Tensor& w = down ? d.w2 : d.w1;
    const bool ekn = d.layout == ExpertLayout::EKN;
    it = cache.emplace(key, make_weight(ekn ? w : w.transpose(1, 2).contiguous(), variant, ekn ? 1 : 2, dt)).first;
  }
  return it->second;
}

MoeMlpArgs make_args(const Data& d, const Variant& v, const std::string& variant, at::ScalarType dt, at::Device dev,
                     bool noncontig) {
  auto prep = [&](const at::Tensor& t) {
    at::Tensor o = t.to(dev, dt);
    return noncontig ? non_contiguous(o) : o;
  };
  MoeMlpArgs a;
  a.x = prep(d.x);
  a.routing = d.routing;
  a.routing.sorted_expert_idxs = d.routing.sorted_expert_idxs.to(dev);
  a.routing.sorted_scattered_idxs = d.routing.sorted_scattered_idxs.to(dev);
  a.routing.expert_offsets = d.routing.expert_offsets.to(dev);
  a.gates = prep(d.gates);
  a.gate_up = weight_to(weight_for(d, false, variant, dt), dev);
  a.down = weight_to(weight_for(d, true, variant, dt), dev);
  if (a.gate_up.is_dense()) a.gate_up.values = prep(a.gate_up.values);
  if (a.down.is_dense()) a.down.values = prep(a.down.values);
  a.layout = d.layout;
  if (v.lora_up) a.gate_up_lora = {prep(d.a1), prep(d.b1), kScalingUp};
  if (v.lora_down) a.down_lora = {prep(d.a2), prep(d.b2), kScalingDown};
  if (v.bias) {
    a.gate_up_bias = prep(d.bias1);
    a.down_bias = prep(d.bias2);
  }
  a.activation = v.act;
  a.packing = v.packing;
  a.limit = kLimit;
  return a;
}

// clamped_glu's derivative jumps where the gate reaches +limit and the up value ±limit: an entry that
// close to a kink lands on either side depending on the last rounding bit of the pre-activation u, and
// then a whole gradient entry switches on or off. Backends legitimately round u differently (XA rounded
// to the compute dtype before ·Bᵀ, another fp32 accumulation order): about one ulp, so the bf16/fp16
// problems' dx would compare rounding luck, not the backends (issue 20: 4–5e-2 against 2e-2). As other
// problems keep clear of ties, these keep clear of the kinks: each (expert, column) of the gate_up bias
// is shifted by the smallest multiple of 0.01 that puts every active entry's u (fp64, from the inputs and
// weights the backend gets) at least 4 ulps of the compute dtype away from every kink. The shifts are
// small next to u's spread, so the clamps still bite on a fair share of the entries.
void keep_off_kinks(Data& d, const Variant& v, const std::string& variant, at::ScalarType dt) {
  if (v.act != MoeActivation::clamped_glu || dt == at::kFloat || dt == at::kDouble) return;
  if (!v.bias) throw std::logic_error("moe.mlp conformance: a clamped_glu variant needs biases (keep_off_kinks)");
  const MoeMlpArgs a = make_args(d, v, variant, dt, at::kCPU, false);
  const auto f64 = at::kDouble;
  auto dense = [&](const ops::WeightTensor& w) {  // [E, K, N], the values the compute dtype holds
    at::Tensor t = ops::dequantize(w, dt).to(f64);
    return a.layout == ExpertLayout::EKN ? t : t.transpose(1, 2);
  };
  const at::Tensor w1 = dense(a.gate_up);
  const int64_t E = w1.size(0), N = w1.size(2), I = N / 2, k = a.routing.top_k;
  const at::Tensor se = a.routing.sorted_expert_idxs, ss = a.routing.sorted_scattered_idxs;
  const at::Tensor on = se.ge(0);
  const at::Tensor ex = se.masked_select(on), rows = ss.masked_select(on).div(k, "floor");  // active entries
  if (ex.numel() == 0) return;
  const at::Tensor x = a.x.to(f64).index_select(0, rows);
  const at::Tensor b_old = a.gate_up_bias.to(f64);
  at::Tensor u = at::bmm(x.unsqueeze(1), w1.index_select(0, ex)).squeeze(1) + b_old.index_select(0, ex);
  if (a.gate_up_lora.defined()) {
    const int64_t r = a.gate_up_lora.a.size(0) / E;
    at::Tensor A = a.gate_up_lora.a.to(f64).view({E, r, -1}).index_select(0, ex);               // [n, r, K]
    at::Tensor B = a.gate_up_lora.b.to(f64).view({N, E, r}).permute({1, 0, 2}).index_select(0, ex);  // [n, N, r]
    u = u + a.gate_up_lora.scaling * at::bmm(B, at::bmm(A, x.unsqueeze(2))).squeeze(2);
  }
  const double L = a.limit;
  const double margin = 4 * std::ldexp(1.0, static_cast<int>(std::floor(std::log2(L))) - (dt == at::kBFloat16 ? 7 : 10));
  at::Tensor bias = d.bias1.clone();
  auto bacc = bias.accessor<float, 2>();
  auto uacc = u.accessor<double, 2>();
  auto eacc = ex.accessor<int64_t, 1>();
  auto bold = b_old.accessor<double, 2>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < N; ++c) {
      const bool gate = a.packing == GluPacking::halves ? c < I : c % 2 == 0;
      bool placed = false;
      for (int step = 0; step <= 200 && !placed; ++step) {
        const double shift = (step % 2 == 0 ? 1 : -1) * 0.01 * ((step + 1) / 2);
        // The bias as the compute dtype will hold it: the check sees the rounded value.
        const double nb = at::scalar_tensor(bacc[e][c] + shift, at::kDouble).to(dt).item<double>();
        placed = true;
        for (int64_t p = 0; p < ex.numel() && placed; ++p) {
          if (eacc[p] != e) continue;
          const double up = uacc[p][c] - bold[e][c] + nb;
          placed = gate ? std::abs(up - L) >= margin : std::abs(std::abs(up) - L) >= margin;
        }
        if (placed) bacc[e][c] = static_cast<float>(nb);
      }
      if (!placed) throw std::logic_error("moe.mlp conformance: no bias shift keeps the pre-activations off the kinks");
    }
  d.bias1 = bias;
}

Tensors inputs_of(const MoeMlpArgs& a) {
  auto w = [](const ops::WeightTensor& t) { return t.is_dense() ? t.values : t.codes; };
  return {{"x", a.x}, {"sorted_expert_idxs", a.routing.sorted_expert_idxs},
          {"sorted_scattered_idxs", a.routing.sorted_scattered_idxs}, {"expert_offsets", a.routing.expert_offsets},
          {"gates", a.gates}, {"gate_up", w(a.gate_up)}, {"gate_up.scales", a.gate_up.scales}, {"down", w(a.down)},
          {"down.scales", a.down.scales}, {"gate_up_bias", a.gate_up_bias}, {"down_bias", a.down_bias},
          {"gate_up_lora.a", a.gate_up_lora.a}, {"gate_up_lora.b", a.gate_up_lora.b},
          {"down_lora.a", a.down_lora.a}, {"down_lora.b", a.down_lora.b}};
}

// The oracle: the block in fp64, per routing entry in scattered order, on the (dequantised) weights the
// backend got, gradients by autograd through plain ATen. Returns y, dx, the LoRA grads and dgates.
Tensors oracle(const MoeMlpArgs& a, const at::Tensor& grad_y) {
  const auto f64 = at::kDouble;
  const auto& s = a.routing;
  const int64_t T = a.x.size(0), k = s.top_k, M = T * k;
  auto dense = [&](const ops::WeightTensor& w) {  // [E, K, N]
    at::Tensor d = ops::dequantize(w.to(at::kCPU), at::kFloat).to(f64);
    return a.layout == ExpertLayout::EKN ? d : d.transpose(1, 2);
  };
  at::Tensor w1 = dense(a.gate_up), w2 = dense(a.down);
  const int64_t E = w1.size(0);
  // expert of scattered entry t·k + j, -1 when inactive
  at::Tensor ex = at::full({M}, -1, at::kLong);
  at::Tensor se = s.sorted_expert_idxs.cpu(), ss = s.sorted_scattered_idxs.cpu();
  at::Tensor act = se.ge(0);
  ex.index_put_({ss.masked_select(act)}, se.masked_select(act));
  at::Tensor on = ex.ge(0).to(f64).unsqueeze(1), e = ex.clamp_min(0);
  auto leaf = [&](const at::Tensor& t) { return t.defined() ? t.detach().cpu().to(f64).requires_grad_(true) : t; };
  at::Tensor x = leaf(a.x), gates = leaf(a.gates), a1 = leaf(a.gate_up_lora.a), b1 = leaf(a.gate_up_lora.b),
             a2 = leaf(a.down_lora.a), b2 = leaf(a.down_lora.b);
  auto proj = [&](const at::Tensor& in, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& la,
                  const at::Tensor& lb, double sc) {
    at::Tensor y = at::bmm(in.unsqueeze(1), w.index_select(0, e)).squeeze(1);
    if (bias.defined()) y = y + bias.cpu().to(f64).index_select(0, e);
    if (la.defined()) {
      const int64_t r = la.size(0) / E;
      at::Tensor A = la.view({E, r, -1}).index_select(0, e);                 // [M, r, K]
      at::Tensor B = lb.view({lb.size(0), E, r}).permute({1, 0, 2}).index_select(0, e);  // [M, N, r]
      at::Tensor xa = at::bmm(A, in.unsqueeze(2));                          // [M, r, 1]
      y = y + sc * at::bmm(B, xa).squeeze(2);
    }
    return y;
  };
  at::Tensor xs = x.repeat_interleave(k, 0);  // row t·k + j = x[t]
  at::Tensor u = proj(xs, w1, a.gate_up_bias, a1, b1, a.gate_up_lora.scaling) * on;
  const int64_t I = u.size(1) / 2;
  at::Tensor g = a.packing == GluPacking::halves ? u.narrow(1, 0, I) : u.slice(1, 0, 2 * I, 2);
  at::Tensor v = a.packing == GluPacking::halves ? u.narrow(1, I, I) : u.slice(1, 1, 2 * I, 2);
  at::Tensor h;
  if (a.activation == MoeActivation::silu_glu) {
    h = g * at::sigmoid(g) * v;
  } else {
    g = g.clamp_max(a.limit);
    h = (v.clamp(-a.limit, a.limit) + 1) * g * at::sigmoid(g * a.alpha);
  }
  at::Tensor ys = proj(h, w2, a.down_bias, a2, b2, a.down_lora.scaling) * on;
  at::Tensor y = (ys.view({T, k, -1}) * gates.unsqueeze(-1)).sum(1);
  y.backward(grad_y.detach().cpu().to(f64));
  auto gr = [](const at::Tensor& t) { return t.defined() ? t.grad() : t; };
  return {{"y", y.detach()}, {"dx", gr(x)}, {"dgate_up_lora_a", gr(a1)}, {"dgate_up_lora_b", gr(b1)},
          {"ddown_lora_a", gr(a2)}, {"ddown_lora_b", gr(b2)}, {"dgates", gr(gates)}};
}

// Tokens whose k entries are all inactive: their y row and dx row must be exact zeros.
at::Tensor dead_tokens(const ops::MoeRouting& r, int64_t T) {
  at::Tensor alive = at::zeros({T * r.top_k}, at::kBool);
  at::Tensor se = r.sorted_expert_idxs.cpu(), ss = r.sorted_scattered_idxs.cpu();
  alive.index_put_({ss.masked_select(se.ge(0))}, true);
  return alive.view({T, r.top_k}).any(1).logical_not().nonzero().flatten();
}

MoeMlpGrads run_fwd_bwd(MoeMlp& op, const MoeMlpArgs& a, const at::Tensor& grad, MoeMlpGrads out = {}) {
  auto r = op.forward(a);
  MoeMlpBackwardArgs b;
  b.grad_y = grad;
  b.saved = r.saved;
  b.out = out;
  return op.backward(a, b);
}

const std::vector<std::string> kGradNames = {"dx", "dgate_up_lora_a", "dgate_up_lora_b", "ddown_lora_a",
                                             "ddown_lora_b", "dgates"};

Tensors grads_of(const MoeMlpGrads& g) {
  return {{"dx", g.dx}, {"dgate_up_lora_a", g.dgate_up_lora_a}, {"dgate_up_lora_b", g.dgate_up_lora_b},
          {"ddown_lora_a", g.ddown_lora_a}, {"ddown_lora_b", g.ddown_lora_b}, {"dgates", g.dgates}};
}

struct Combo {
  std::string dtype, variant;
  ExpertLayout layout;
  std::string name() const { return ax::str(dtype, "/", variant, "/", ops::to_string(layout)); }
};

Problem problem(const Suite& suite, const std::string& phase, const Combo& c, const Shape& shape, const Variant& v,
                const std::string& name) {
  Problem p;
  p.phase = phase;
  p.name = name;
  p.dtype = c.dtype;
  const std::string key = ax::str("moe.mlp/", phase == "fwd+bwd" ? "both" : phase, "/", name);
  const unsigned seed = suite.seed();
  const std::string variant = c.variant, dtype = c.dtype;
  auto data = [=](const std::string& k) {
    Data d = make_data(shape, c.layout, k, seed);
    keep_off_kinks(d, v, variant, scalar_type(dtype));
    return std::make_shared<const Data>(std::move(d));
  };
  auto first = data(key);
  p.bind = [=](const Bind& b) {
    auto d = b.draw ? data(key + "#1") : first;
    const at::ScalarType dt = scalar_type(dtype);
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<MoeMlpArgs>(make_args(*d, v, variant, dt, b.device, noncontig));
    if (b.for_graph) args->check_values = false;
    at::Tensor grad = d->grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    Call call;
    call.inputs = inputs_of(*args);
    if (phase != "fwd") call.inputs.emplace_back("grad_y", grad);
    call.run = [args, grad, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<MoeMlp>();
      // A call the backend declines goes to the next backend in the engine: nothing of this one to certify.
      if (auto why = op.decline(*args)) skip(ax::str("the backend declines this call: ", *why));
      Tensors res;
      if (phase != "bwd") {
        MoeMlpArgs a = *args;
        a.out = output(out, "y");
        res.emplace_back("y", op.forward(a).y);
      }
      if (phase != "fwd") {
        MoeMlpGrads preset{output(out, "dx"), output(out, "dgate_up_lora_a"), output(out, "dgate_up_lora_b"),
                           output(out, "ddown_lora_a"), output(out, "ddown_lora_b"), output(out, "dgates")};
        Tensors g = grads_of(run_fwd_bwd(op, *args, grad, preset));
        res.insert(res.end(), g.begin(), g.end());
      }
      return res;
    };
    return call;
  };
  const OpTolerance& tol = suite.spec().tolerance(c.dtype);
  std::vector<std::string> outs;
  if (phase == "fwd") outs = {"y"};
  if (phase == "bwd") {
    outs = {"dx", "dgates"};
    if (v.lora_up) outs.insert(outs.end(), {"dgate_up_lora_a", "dgate_up_lora_b"});
    if (v.lora_down) outs.insert(outs.end(), {"ddown_lora_a", "ddown_lora_b"});
  }
  for (const auto& o : outs) {
    p.compare.push_back({o, phase == "fwd" ? tol.forward : tol.backward});
    if (v.out) p.preallocated.push_back(o);
  }
  if (phase == "fwd+bwd") return p;
  const bool fp32 = c.dtype == "fp32";
  const double t = phase == "fwd" ? tol.forward : tol.backward;
  p.extra = [first, v, variant, outs, fp32, t](const Tensors& got, const Tensors&) {
    std::vector<std::string> msgs;
    at::Tensor dead = dead_tokens(first->routing, first->s.T);
    for (const char* o : {"y", "dx"}) {
      at::Tensor out = output(got, o);
      if (!out.defined() || dead.numel() == 0) continue;
      if (out.detach().cpu().index_select(0, dead).ne(0).any().item<bool>())
        fail(ax::str(o, ": rows of tokens with no active routing entry are not exactly zero"));
      msgs.push_back(ax::str(o, ": ", dead.numel(), " dead-token rows exactly zero"));
    }
    if (fp32) {  // the independent fp64 oracle (fp32 only: bf16/fp16 round u and h between the projections)
      MoeMlpArgs a = make_args(*first, v, variant, at::kFloat, at::kCPU, false);
      Tensors want = oracle(a, first->grad);
      for (const auto& o : outs) msgs.push_back(check_close(o + " vs fp64 oracle", output(got, o).cpu().to(at::kDouble),
                                                            output(want, o), t));
    }
    return msgs.empty() ? std::string("compared with the reference") : join(msgs, "; ");
  };
  return p;
}

Problem case_problem(const Suite& suite, const std::string& phase, const Combo& c, const Shape& s, const Variant& v) {
  return problem(suite, phase, c, s, v, ax::str(c.name(), "/", s.name(), "/", v.name()));
}

// Quantised formats block along K (H for gate_up, I for down): round both up so every block divides.
Shape fit(Shape s, const std::string& variant) {
  auto round_up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
  const std::string f = base_format(variant);
  const int64_t m = f == "mxfp4" ? 32 : f == "nvfp4" ? 16 : f == "nf4" ? 64 : 1;
  s.H = round_up(s.H, m);
  s.I = round_up(s.I, m);
  return s;
}

void bad_input_cases(Suite& suite, const Combo& c) {
  // Tile-aligned (H, I multiples of 64), so the grad_y case, which runs a good forward first, reaches every
  // backend (sonicmoe declines other shapes).
  const Shape s = fit({4, 2, 6, 64, 64, 2}, c.variant);
  const Variant v{.bias = true};
  const at::ScalarType dt = scalar_type(c.dtype);
  Data d = make_data(s, c.layout, ax::str("moe.mlp/badinput/", c.name()), suite.seed());
  const MoeMlpArgs good = make_args(d, v, c.variant, dt, suite.device(), false);
  auto fwd = [](const Backend& be, const MoeMlpArgs& a) { be.as<MoeMlp>().forward(a); };
  using B = const Backend&;
  std::vector<BadInput> bad = {
      {"x_dtype", "x", [=](B be) { auto a = good; a.x = a.x.to(at::kInt); fwd(be, a); }},
      {"x_width", "gate_up", [=](B be) { auto a = good; a.x = a.x.narrow(1, 0, s.H - 1); fwd(be, a); }},
      {"gates_missing", "gates", [=](B be) { auto a = good; a.gates = at::Tensor(); fwd(be, a); }},
      {"gates_shape", "gates", [=](B be) { auto a = good; a.gates = a.gates.narrow(1, 0, 1); fwd(be, a); }},
      {"down_bias_shape", "down_bias", [=](B be) { auto a = good; a.down_bias = a.down_bias.narrow(1, 0, s.H - 1); fwd(be, a); }},
      {"gate_up_bias_shape", "gate_up_bias",
       [=](B be) { auto a = good; a.gate_up_bias = a.gate_up_bias.narrow(0, 0, s.E - 1); fwd(be, a); }},
      {"gate_up_lora_b_shape", "gate_up_lora.b",
       [=](B be) { auto a = good; a.gate_up_lora.b = a.gate_up_lora.b.narrow(0, 0, 2 * s.I - 1); fwd(be, a); }},
      {"down_lora_a_only", "down_lora.b", [=](B be) { auto a = good; a.down_lora.b = at::Tensor(); fwd(be, a); }},
      {"limit", "limit",
       [=](B be) { auto a = good; a.activation = MoeActivation::clamped_glu; a.limit = 0; fwd(be, a); }},
      {"expert_offsets_length", "expert_offsets",
       [=](B be) { auto a = good; a.routing.expert_offsets = a.routing.expert_offsets.narrow(0, 0, s.E - 1); fwd(be, a); }},
      {"out_shape", "out", [=](B be) { auto a = good; a.out = at::empty({s.T + 1, s.H}, a.x.options()); fwd(be, a); }},
      {"grad_y_shape", "grad_y",
       [=](B be) {
         auto& op = be.as<MoeMlp>();
         auto r = op.forward(good);
         MoeMlpBackwardArgs b;
         b.grad_y = at::zeros({s.T, s.H + 1}, good.x.options());
         b.saved = r.saved;
         op.backward(good, b);
       }},
  };
  suite.bad_inputs(c.name(), bad);
}

}  // namespace

void moe_mlp_problems(Suite& suite) {
  weight_cache().clear();
  const std::vector<Shape> shapes = {
      {8, 2, 17, 40, 24, 3},                // main: nothing a multiple of a tile
      {1, 1, 5, 16, 8, 2},                  // E=1, k=1
      {4, 4, 3, 17, 5, 1},                  // k=E, r=1
      {8, 2, 5, 32, 16, 4, "zero_tokens"},  // most experts get no token
      {6, 2, 33, 32, 12, 3, "remote"},      // -1 entries after the last offset (some tokens have none active)
      {5, 2, 12, 24, 8, 2, "dropped"},      // -1 entries inside expert ranges
      // H and I multiples of 64: the shapes tiled kernels take (sonicmoe declines the others). I = 192 is
      // no multiple of 128 (half a GLU column tile); odd and wide ranks; -1 entries inside and after ranges.
      {8, 2, 40, 128, 192, 3},
      {6, 2, 33, 64, 64, 16, "dropped"},
      {4, 2, 21, 64, 128, 8, "remote"},
  };
  auto tile_aligned = [](const Shape& s) { return s.H % 64 == 0 && s.I % 64 == 0; };
  std::vector<std::string> variants;
  for (const char* v : {"dense", "nf4", "nf4-dq", "mxfp4", "nvfp4", "fp8", "fp8-b8x16"})
    if (suite.claims_format(base_format(v))) variants.push_back(v);
  std::vector<ExpertLayout> layouts;
  for (ExpertLayout l : {ExpertLayout::EKN, ExpertLayout::ENK})
    if (suite.claims_layout(ops::to_string(l))) layouts.push_back(l);

  bool first_combo = true;
  for (const auto& dtype : suite.dtypes())
    for (const auto& variant : variants)
      for (ExpertLayout layout : layouts) {
        const Combo c{dtype, variant, layout};
        // Quick grid: the first combination gets every shape with two variants (silu and gpt-oss) and the
        // main shape with all; the others the main shape with the gpt-oss variant and the noncontig+out one,
        // and the dropped-entries shape with the silu one.
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          const Shape s = fit(shapes[i], variant);
          for (std::size_t j = 0; j < all_variants().size(); ++j) {
            bool run = !suite.quick();
            if (first_combo) run = run || i == 0 || j <= 1;
            else run = run || (i == 0 && (j == 1 || j == 4)) || (shapes[i].routing == "dropped" && j == 0);
            if (tile_aligned(shapes[i]) && variant == "dense") run = true;  // every variant, each dtype and layout
            if (!run) continue;
            for (const char* phase : {"fwd", "bwd"}) {
              Problem p = case_problem(suite, phase, c, s, all_variants()[j]);
              p.graph = i == 0 && j <= 1;
              suite.accuracy(p);
            }
          }
        }
        const Shape det = fit({4, 2, 64, 40, 24, 4}, variant);
        suite.determinism(case_problem(suite, "fwd+bwd", c, det, all_variants()[1]));
        if (variant == "dense") suite.determinism(case_problem(suite, "fwd+bwd", c, shapes[6], all_variants()[0]));
        const Shape sa = fit(shapes[0], variant), sb = fit({3, 1, 11, 32, 8, 2}, variant);
        suite.repeat(problem(suite, "fwd+bwd", c, sa, all_variants()[0], ax::str(c.name(), "/", sa.name())),
                     problem(suite, "fwd+bwd", c, sb, all_variants()[1], sb.name()));
        if (first_combo || !suite.quick()) bad_input_cases(suite, c);
        first_combo = false;
      }
  weight_cache().clear();
}

}  // namespace ax::conformance::detail
