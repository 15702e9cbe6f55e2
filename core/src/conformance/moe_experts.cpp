// Conformance cases for moe.experts (docs/ops/moe.experts.md): forward Y and backward dX, dA, dB, dgates
// against the reference over a shape grid with the routing edge cases, per claimed dtype, weight format
// and layout; guard bands around preallocated outputs; determinism; repeatability; bad input; 2^31.
#include <algorithm>
#include <map>
#include <numeric>

#include "axengine/ops/moe_experts.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::ExpertLayout;
using ops::MoeExperts;
using ops::MoeExpertsArgs;
using ops::MoeExpertsBackwardArgs;
using ops::MoeExpertsGrads;
using ops::MoeRouting;

constexpr double kScaling = 0.75;  // never 1: a backend that ignores the scaling must show

// Routing modes: "random" top-k; "zero_tokens" (most experts get no token); "remote" (expert parallel:
// entries for experts on other ranks are -1, after offsets[E-1]); "dropped" (-1 entries inside ranges).
struct Shape {
  int64_t E, k, T, K, N, r;
  std::string routing = "random";
  std::string name() const {
    std::string s = kv({{"E", E}, {"k", k}, {"T", T}, {"K", K}, {"N", N}, {"r", r}});
    return routing == "random" ? s : s + "," + routing;
  }
};

struct Variant {
  bool grouped_in = false, grouped_out = false, gates = false, lora = true, bias = false;
  bool noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{grouped_in ? "grouped_in" : "scattered_in",
                               gates ? "gates" : (grouped_out ? "grouped_out" : "scattered_out")};
    p.push_back(lora ? "lora" : "nolora");
    if (bias) p.push_back("bias");
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

const std::vector<Variant>& all_variants() {
  static const std::vector<Variant> v = {
      {.lora = true, .bias = true},
      {.grouped_in = true, .grouped_out = true, .lora = true},
      {.gates = true, .lora = true, .bias = true},
      {.lora = false},
      {.gates = true, .lora = true, .bias = true, .noncontig = true, .out = true},
      {.grouped_in = true, .lora = true, .bias = true, .noncontig = true, .out = true},
  };
  return v;
}

// Everything of one problem in fp32 on the CPU; cast and moved per call.
struct Problem {
  Shape s;
  ExpertLayout layout;
  at::Tensor x, w, lora_a, lora_b, bias, gates, grad;  // grad: for the variant's output shape
  MoeRouting routing;
};

MoeRouting make_routing(const Shape& s, at::Generator& g) {
  const int64_t M = s.T * s.k;
  // Experts a token may pick. Remote experts (>= E) stand for other ranks' experts.
  std::vector<int64_t> allowed;
  const int64_t pickable = s.routing == "remote" ? s.E + std::max<int64_t>(2, s.E / 2) : s.E;
  for (int64_t e = 0; e < pickable; ++e)
    if (s.routing != "zero_tokens" || e % 3 == 0) allowed.push_back(e);
  for (int64_t e = 0; static_cast<int64_t>(allowed.size()) < s.k; ++e)
    if (std::find(allowed.begin(), allowed.end(), e) == allowed.end()) allowed.push_back(e);
  std::vector<int64_t> ex(M);
  for (int64_t t = 0; t < s.T; ++t) {
    at::Tensor perm = at::randperm(static_cast<int64_t>(allowed.size()), g, at::kLong);
    for (int64_t j = 0; j < s.k; ++j) ex[t * s.k + j] = allowed[perm[j].item<int64_t>()];
  }
  std::vector<int64_t> order(M);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ex[a] < ex[b]; });
  at::Tensor sorted_e = at::empty({M}, at::kLong), sorted_s = at::empty({M}, at::kLong);
  at::Tensor offsets = at::zeros({s.E}, at::kLong);
  for (int64_t p = 0; p < M; ++p) {
    int64_t e = ex[order[p]];
    sorted_e[p] = e < s.E ? e : -1;
    sorted_s[p] = order[p];
  }
  for (int64_t e = 0; e < s.E; ++e)
    offsets[e] = static_cast<int64_t>(std::count_if(ex.begin(), ex.end(), [&](int64_t v) { return v <= e; }));
  if (s.routing == "dropped") {
    // Drop about a fifth of the entries in place: they stay inside their expert's range.
    at::Tensor drop = at::rand({M}, g) < 0.2;
    sorted_e.masked_fill_(drop, -1);
  }
  return {sorted_e, sorted_s, offsets, s.k};
}

Problem make_problem(const Shape& s, ExpertLayout layout, const Variant& v, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  auto f32 = at::TensorOptions().dtype(at::kFloat);
  Problem p{s, layout};
  const int64_t M = s.T * s.k;
  p.routing = make_routing(s, g);
  p.x = at::randn({v.grouped_in ? M : s.T, s.K}, g, f32);
  // Scaled so that base, LoRA and bias terms are all of order one: a bug in any of them shows.
  // The weight depends on the shape only (its own generator), so quantised copies can be shared by
  // every case of that shape (quantising is the slow part of a CPU run).
  at::Generator gw = case_generator(seed, "moe.experts/weight/" + s.name());
  at::Tensor w = at::randn({s.E, s.K, s.N}, gw, f32) / std::sqrt(static_cast<double>(s.K));
  p.w = layout == ExpertLayout::EKN ? w : w.transpose(1, 2).contiguous();
  p.lora_a = at::randn({s.r * s.E, s.K}, g, f32) / std::sqrt(static_cast<double>(s.K));
  p.lora_b = at::randn({s.N, s.r * s.E}, g, f32) / std::sqrt(static_cast<double>(s.r));
  p.bias = at::randn({s.E, s.N}, g, f32) * 0.5;
  p.gates = at::rand({s.T, s.k}, g, f32) + 0.1;
  p.grad = at::randn({v.gates ? s.T : M, s.N}, g, f32);
  return p;
}

// The blocked axis of mxfp4/nvfp4 weights: K of the logical weight.
int64_t k_axis(ExpertLayout layout) { return layout == ExpertLayout::EKN ? 1 : 2; }

// Quantised weights of the current target, by (shape, layout, variant, dtype); cleared per target.
std::map<std::string, ops::WeightTensor>& weight_cache() {
  static std::map<std::string, ops::WeightTensor> cache;
  return cache;
}

ops::WeightTensor weight_for(const Problem& p, const std::string& variant, at::ScalarType dt) {
  const std::string key = ax::str(p.s.name(), "/", ops::to_string(p.layout), "/", variant, "/",
                                     variant == "dense" ? dtype_name(dt) : std::string("any"));
  auto& cache = weight_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_weight(p.w, variant, k_axis(p.layout), dt)).first;
  return it->second;
}

// The args one backend sees: cast to `dtype`, on `device`, optionally with non-contiguous tensors.
MoeExpertsArgs make_args(const Problem& p, const Variant& v, const ops::WeightTensor& w32q, at::ScalarType dtype,
                         at::Device device, bool noncontig) {
  auto prep = [&](const at::Tensor& t) {
    at::Tensor o = t.to(device, dtype);
    return noncontig ? non_contiguous(o) : o;
  };
  MoeExpertsArgs a;
  a.x = prep(p.x);
  a.routing = p.routing;
  a.routing.sorted_expert_idxs = p.routing.sorted_expert_idxs.to(device);
  a.routing.sorted_scattered_idxs = p.routing.sorted_scattered_idxs.to(device);
  a.routing.expert_offsets = p.routing.expert_offsets.to(device);
  a.weight = weight_to(w32q, device);
  if (a.weight.is_dense()) a.weight.values = prep(a.weight.values);
  a.layout = p.layout;
  if (v.lora) {
    a.lora_a = prep(p.lora_a);
    a.lora_b = prep(p.lora_b);
    a.scaling = kScaling;
  }
  if (v.bias) a.bias = prep(p.bias);
  if (v.gates) a.gates = prep(p.gates);
  a.grouped_in = v.grouped_in;
  a.grouped_out = v.grouped_out;
  return a;
}

void guard_inputs(InputGuard& g, const MoeExpertsArgs& a) {
  g.add("x", a.x);
  g.add("sorted_expert_idxs", a.routing.sorted_expert_idxs);
  g.add("sorted_scattered_idxs", a.routing.sorted_scattered_idxs);
  g.add("expert_offsets", a.routing.expert_offsets);
  g.add("weight", a.weight.is_dense() ? a.weight.values : a.weight.codes);
  g.add("weight.scales", a.weight.scales);
  g.add("lora_a", a.lora_a);
  g.add("lora_b", a.lora_b);
  g.add("bias", a.bias);
  g.add("gates", a.gates);
}

// Quantised formats block along K: round K up so each format's block divides it (the name shows it).
Shape fit(Shape s, const std::string& variant) {
  auto round_up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
  const std::string f = base_format(variant);
  if (f == "mxfp4") s.K = round_up(s.K, 32);
  if (f == "nvfp4") s.K = round_up(s.K, 16);
  if (f == "nf4") s.K = round_up(s.K, 64);  // every expert's K·N a whole number of nf4 blocks
  return s;
}

struct Combo {
  std::string dtype, variant;  // weight variant: "dense", "nf4-dq", ...
  ExpertLayout layout;
  std::string prefix(const std::string& phase) const {
    return ax::str("moe.experts/", phase, "/", dtype, "/", variant, "/", ops::to_string(layout));
  }
};

std::string join_msgs(const std::vector<std::string>& m) { return join(m, "; "); }

void forward_case(CaseRunner& cases, const Combo& c, const Shape& shape, const Variant& v) {
  const Target& T = cases.target();
  const std::string name = ax::str(c.prefix("fwd"), "/", shape.name(), "/", v.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(c.dtype);
    Problem p = make_problem(shape, c.layout, v, name, T.seed);
    ops::WeightTensor wq = weight_for(p, c.variant, dt);
    MoeExpertsArgs ra = make_args(p, v, wq, dt, T.reference_device, false);
    MoeExpertsArgs ia = make_args(p, v, wq, dt, T.device, v.noncontig);
    at::Tensor want = T.ref<MoeExperts>().forward(ra).y;
    std::optional<GuardedOut> out;
    if (v.out) {
      out.emplace(want.sizes(), dt, T.device);
      ia.out = out->view();
    }
    InputGuard guard;
    guard_inputs(guard, ia);
    at::Tensor got = T.impl<MoeExperts>().forward(ia).y;
    std::vector<std::string> msgs;
    if (out) msgs.push_back(out->check("y", got));
    msgs.push_back(check_close("y", got, want.to(T.device), tolerance(c.dtype).forward));
    if (!v.gates) {
      // Rows of inactive entries (-1) must be exact zeros, not merely small.
      at::Tensor inactive = p.routing.sorted_expert_idxs.eq(-1);
      at::Tensor rows = v.grouped_out ? inactive.nonzero().flatten() : p.routing.sorted_scattered_idxs.masked_select(inactive);
      if (rows.numel() > 0) {
        if (got.detach().to(at::kCPU).index_select(0, rows).ne(0).any().item<bool>())
          fail(ax::str("y: rows of inactive (-1) routing entries are not exactly zero"));
        msgs.push_back(ax::str("y: ", rows.numel(), " inactive rows exactly zero"));
      }
    }
    msgs.push_back(guard.check());
    return join_msgs(msgs);
  });
}

MoeExpertsGrads run_fwd_bwd(MoeExperts& op, const MoeExpertsArgs& a, const at::Tensor& grad, MoeExpertsGrads out = {}) {
  auto r = op.forward(a);
  MoeExpertsBackwardArgs b;
  b.grad_y = grad;
  b.saved = r.saved;
  b.out = out;
  return op.backward(a, b);
}

void backward_case(CaseRunner& cases, const Combo& c, const Shape& shape, const Variant& v) {
  const Target& T = cases.target();
  const std::string name = ax::str(c.prefix("bwd"), "/", shape.name(), "/", v.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(c.dtype);
    Problem p = make_problem(shape, c.layout, v, name, T.seed);
    ops::WeightTensor wq = weight_for(p, c.variant, dt);
    MoeExpertsArgs ra = make_args(p, v, wq, dt, T.reference_device, false);
    MoeExpertsArgs ia = make_args(p, v, wq, dt, T.device, v.noncontig);
    at::Tensor grad = p.grad.to(dt);
    MoeExpertsGrads want = run_fwd_bwd(T.ref<MoeExperts>(), ra, grad.to(T.reference_device));
    MoeExpertsGrads preset;
    std::vector<std::pair<std::string, GuardedOut>> outs;
    if (v.out) {
      outs.emplace_back("dx", GuardedOut(ia.x.sizes(), dt, T.device));
      preset.dx = outs.back().second.view();
      if (v.lora) {
        outs.emplace_back("dlora_a", GuardedOut(ia.lora_a.sizes(), dt, T.device));
        preset.dlora_a = outs.back().second.view();
        outs.emplace_back("dlora_b", GuardedOut(ia.lora_b.sizes(), dt, T.device));
        preset.dlora_b = outs.back().second.view();
      }
      if (v.gates) {
        outs.emplace_back("dgates", GuardedOut(ia.gates.sizes(), dt, T.device));
        preset.dgates = outs.back().second.view();
      }
    }
    InputGuard guard;
    guard_inputs(guard, ia);
    at::Tensor igrad = v.noncontig ? non_contiguous(grad.to(T.device)) : grad.to(T.device);
    guard.add("grad_y", igrad);
    MoeExpertsGrads got = run_fwd_bwd(T.impl<MoeExperts>(), ia, igrad, preset);
    const double tol = tolerance(c.dtype).backward;
    std::vector<std::string> msgs;
    for (auto& [what, g] : outs) {
      const at::Tensor& t = what == "dx" ? got.dx : what == "dlora_a" ? got.dlora_a : what == "dlora_b" ? got.dlora_b : got.dgates;
      msgs.push_back(g.check(what, t));
    }
    msgs.push_back(check_close("dx", got.dx, want.dx.to(T.device), tol));
    if (v.lora) {
      msgs.push_back(check_close("dlora_a", got.dlora_a, want.dlora_a.to(T.device), tol));
      msgs.push_back(check_close("dlora_b", got.dlora_b, want.dlora_b.to(T.device), tol));
    }
    if (v.gates) msgs.push_back(check_close("dgates", got.dgates, want.dgates.to(T.device), tol));
    msgs.push_back(guard.check());
    return join_msgs(msgs);
  });
}

// Two identical calls: bitwise identical y and grads (the contract promises determinism). Many tokens per
// expert, so a reduction in an unspecified order would change bits.
void determinism_case(CaseRunner& cases, const Combo& c) {
  const Target& T = cases.target();
  const Shape shape = fit({4, 2, 96, 40, 24, 4}, c.variant);
  const Variant v{.gates = true, .lora = true, .bias = true};
  const std::string name = ax::str(c.prefix("determinism"), "/", shape.name(), "/", v.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(c.dtype);
    Problem p = make_problem(shape, c.layout, v, name, T.seed);
    MoeExpertsArgs a = make_args(p, v, weight_for(p, c.variant, dt), dt, T.device, false);
    at::Tensor grad = p.grad.to(T.device, dt);
    auto& op = T.impl<MoeExperts>();
    at::Tensor y1 = op.forward(a).y, y2 = op.forward(a).y;
    MoeExpertsGrads g1 = run_fwd_bwd(op, a, grad), g2 = run_fwd_bwd(op, a, grad);
    return join_msgs({check_bitwise("y", y1, y2), check_bitwise("dx", g1.dx, g2.dx),
                      check_bitwise("dlora_a", g1.dlora_a, g2.dlora_a), check_bitwise("dlora_b", g1.dlora_b, g2.dlora_b),
                      check_bitwise("dgates", g1.dgates, g2.dgates)});
  });
}

// A, then a different problem B, then A again: A's answers must not change (no state kept between
// calls, e.g. a cache keyed on a pointer or a shape).
void repeat_case(CaseRunner& cases, const Combo& c) {
  const Target& T = cases.target();
  const Shape sa = fit({8, 2, 17, 65, 130, 3}, c.variant), sb = fit({3, 1, 11, 32, 20, 2}, c.variant);
  const Variant v{.lora = true, .bias = true};
  const std::string name = ax::str(c.prefix("repeat"), "/", sa.name(), "/then/", sb.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(c.dtype);
    auto& op = T.impl<MoeExperts>();
    Problem pa = make_problem(sa, c.layout, v, name + "A", T.seed), pb = make_problem(sb, c.layout, v, name + "B", T.seed);
    MoeExpertsArgs a = make_args(pa, v, weight_for(pa, c.variant, dt), dt, T.device, false);
    MoeExpertsArgs b = make_args(pb, v, weight_for(pb, c.variant, dt), dt, T.device, false);
    at::Tensor ga = pa.grad.to(T.device, dt), gb = pb.grad.to(T.device, dt);
    at::Tensor y1 = op.forward(a).y;
    MoeExpertsGrads g1 = run_fwd_bwd(op, a, ga);
    op.forward(b);
    run_fwd_bwd(op, b, gb);
    at::Tensor y2 = op.forward(a).y;
    MoeExpertsGrads g2 = run_fwd_bwd(op, a, ga);
    return join_msgs({check_bitwise("y", y1, y2), check_bitwise("dx", g1.dx, g2.dx),
                      check_bitwise("dlora_a", g1.dlora_a, g2.dlora_a)});
  });
}

// Each bad input must throw an exception naming the argument at fault.
void bad_input_cases(CaseRunner& cases, const Combo& c) {
  const Target& T = cases.target();
  const Shape s = fit({4, 2, 6, 32, 16, 2}, c.variant);
  const Variant v{.gates = true, .lora = true, .bias = true};
  const at::ScalarType dt = scalar_type(c.dtype);
  Problem p = make_problem(s, c.layout, v, c.prefix("badinput"), T.seed);
  const MoeExpertsArgs good = make_args(p, v, weight_for(p, c.variant, dt), dt, T.device, false);
  auto fwd = [&](MoeExpertsArgs a) { T.impl<MoeExperts>().forward(a); };
  auto opt = at::TensorOptions().device(T.device);
  struct Bad {
    std::string what, argument;
    std::function<void()> call;
  };
  std::vector<Bad> bad = {
      {"x_dtype", "x", [&] { auto a = good; a.x = a.x.to(at::kInt); fwd(a); }},
      {"x_rank", "x", [&] { auto a = good; a.x = a.x.unsqueeze(0); fwd(a); }},
      {"x_width", "x", [&] { auto a = good; a.x = a.x.narrow(1, 0, s.K - 1); fwd(a); }},
      {"lora_a_shape", "lora_a", [&] { auto a = good; a.lora_a = a.lora_a.narrow(0, 0, s.r * s.E - 1); fwd(a); }},
      {"lora_b_without_lora_a", "lora_a", [&] { auto a = good; a.lora_a = at::Tensor(); fwd(a); }},
      {"lora_b_shape", "lora_b", [&] { auto a = good; a.lora_b = a.lora_b.narrow(0, 0, s.N - 1); fwd(a); }},
      {"lora_dtype", "lora_a", [&] { auto a = good; a.lora_a = a.lora_a.to(at::kDouble); fwd(a); }},
      {"bias_shape", "bias", [&] { auto a = good; a.bias = a.bias.narrow(0, 0, s.E - 1); fwd(a); }},
      {"gates_shape", "gates", [&] { auto a = good; a.gates = a.gates.narrow(1, 0, 1); fwd(a); }},
      {"expert_offsets_length", "expert_offsets",
       [&] { auto a = good; a.routing.expert_offsets = a.routing.expert_offsets.narrow(0, 0, s.E - 1); fwd(a); }},
      {"expert_offsets_dtype", "expert_offsets",
       [&] { auto a = good; a.routing.expert_offsets = a.routing.expert_offsets.to(at::kFloat); fwd(a); }},
      {"routing_lengths_mismatch", "sorted_scattered_idxs",
       [&] { auto a = good; a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.narrow(0, 0, s.T * s.k - 1); fwd(a); }},
      {"expert_offsets_inconsistent", "expert_offsets",
       [&] {
         auto a = good;
         a.routing.expert_offsets = a.routing.expert_offsets.clone();
         a.routing.expert_offsets[0] += 1;  // the ids say otherwise
         fwd(a);
       }},
      {"scattered_idx_out_of_range", "sorted_scattered_idxs",
       [&] {
         auto a = good;
         a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.clone();
         a.routing.sorted_scattered_idxs[0] = s.T * s.k + 5;
         fwd(a);
       }},
      {"expert_id_out_of_range", "sorted_expert_idxs",
       [&] {
         auto a = good;
         a.routing.sorted_expert_idxs = a.routing.sorted_expert_idxs.clone();
         a.routing.sorted_expert_idxs[s.T * s.k - 1] = s.E;
         fwd(a);
       }},
      {"gates_with_grouped_out", "gates", [&] { auto a = good; a.grouped_out = true; fwd(a); }},
      {"out_shape", "out", [&] { auto a = good; a.out = at::empty({s.T + 1, s.N}, opt.dtype(dt)); fwd(a); }},
      {"grad_y_shape", "grad_y",
       [&] {
         auto& op = T.impl<MoeExperts>();
         auto r = op.forward(good);
         MoeExpertsBackwardArgs b;
         b.grad_y = at::zeros({s.T, s.N + 1}, opt.dtype(dt));
         b.saved = r.saved;
         op.backward(good, b);
       }},
  };
  if (at::hasCUDA()) {
    at::Device other = T.device.is_cuda() ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0);
    bad.push_back({"x_device", "x", [&, other] { auto a = good; a.x = a.x.to(other); fwd(a); }});
  } else {
    cases.skip_case(c.prefix("badinput") + "/x_device", "needs a second device (no CUDA device present)");
  }
  for (auto& b : bad)
    cases.run(ax::str(c.prefix("badinput"), "/", b.what), [&] { return check_throws_naming(b.argument, b.call); });
}

// Output rows x N > 2^31 elements: 32-bit index arithmetic overflows. CUDA only, when the GPU has room.
void large_case(CaseRunner& cases, const Combo& c) {
  const Target& T = cases.target();
  const int64_t N = 2048, K = 64, E = 4, k = 1;
  const int64_t Tt = (int64_t{1} << 31) / N + 64;  // T·k·N just past 2^31
  const Shape s{E, k, Tt, K, N, 0};
  const std::string name = ax::str(c.prefix("fwd"), "/", s.name(), "/index_over_2^31");
  if (!T.device.is_cuda()) return cases.skip_case(name, "index products past 2^31 are checked on CUDA only");
  const std::size_t need = static_cast<std::size_t>(Tt) * N * 2 * 2 * 3;  // y twice + slack, 2-byte dtype
  if (c.dtype == "fp32") return cases.skip_case(name, "run in bf16/fp16 only (half the memory)");
  if (cuda_free_bytes(T.device.index()) < need)
    return cases.skip_case(name, ax::str("needs ~", need >> 30, " GiB free on the GPU"));
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(c.dtype);
    auto dev = at::TensorOptions().device(T.device);
    at::Generator g = case_generator(T.seed, name);
    MoeExpertsArgs a;
    a.x = at::randn({Tt, K}, g, at::kFloat).to(T.device, dt);
    // Token t goes to expert t % E: offsets are easy, every expert busy.
    at::Tensor ex = at::arange(Tt, dev.dtype(at::kLong)) % E;
    auto sorted = ex.sort(/*stable=*/true, 0, false);
    a.routing.sorted_expert_idxs = std::get<0>(sorted);
    a.routing.sorted_scattered_idxs = std::get<1>(sorted);
    a.routing.expert_offsets = at::bincount(ex, {}, E).cumsum(0);
    a.routing.top_k = k;
    a.weight = weight_to(make_weight(at::randn({E, K, N}, g, at::kFloat) / 8.0, c.variant, 1, dt), T.device);
    a.layout = ExpertLayout::EKN;
    a.grouped_out = true;
    a.check_values = false;
    at::Tensor got = T.impl<MoeExperts>().forward(a).y;
    // Compare the last rows (where a 32-bit offset would have wrapped) against the reference on them.
    const int64_t tail = 4096;
    MoeExpertsArgs ra = a;
    auto exr = at::arange(Tt - tail, Tt, dev.dtype(at::kLong)) % E;
    auto sr = exr.sort(true, 0, false);
    ra.x = a.x.narrow(0, Tt - tail, tail);
    ra.routing.sorted_expert_idxs = std::get<0>(sr);
    ra.routing.sorted_scattered_idxs = std::get<1>(sr);
    ra.routing.expert_offsets = at::bincount(exr, {}, E).cumsum(0);
    at::Tensor want = T.ref<MoeExperts>().forward(ra).y;
    // got is grouped (expert-sorted over all tokens): pick the rows of the tail tokens.
    at::Tensor pos = at::empty({Tt}, dev.dtype(at::kLong));
    pos.index_put_({a.routing.sorted_scattered_idxs}, at::arange(Tt, dev.dtype(at::kLong)));
    at::Tensor posr = at::empty({tail}, dev.dtype(at::kLong));
    posr.index_put_({ra.routing.sorted_scattered_idxs}, at::arange(tail, dev.dtype(at::kLong)));
    at::Tensor got_tail = got.index_select(0, pos.narrow(0, Tt - tail, tail));
    at::Tensor want_tail = want.index_select(0, posr);
    return check_close("y (last 4096 tokens)", got_tail, want_tail, tolerance(c.dtype).forward);
  });
}

}  // namespace

void run_moe_experts(CaseRunner& cases) {
  const Target& T = cases.target();
  weight_cache().clear();
  // Edge cases first; the quick grid keeps them all.
  const std::vector<Shape> shapes = {
      {8, 2, 17, 65, 130, 3},                  // the main shape: nothing a multiple of a tile
      {1, 1, 5, 16, 24, 2},                    // E=1, k=1
      {4, 4, 3, 17, 3, 1},                     // k=E, r=1
      {6, 2, 1, 33, 65, 5},                    // T=1
      {8, 2, 5, 48, 40, 4, "zero_tokens"},     // most experts get no token
      {6, 2, 9, 32, 17, 3, "remote"},          // expert parallel: -1 entries after the last expert
      {5, 2, 12, 40, 24, 2, "dropped"},        // -1 entries inside expert ranges
  };
  const std::vector<Shape> big = {{16, 4, 130, 256, 96, 8}, {32, 8, 65, 128, 130, 16}};
  std::vector<std::string> variants;
  for (const char* v : {"dense", "nf4", "nf4-dq", "mxfp4", "nvfp4", "nvfp4-pe"})
    if (T.claims_format(base_format(v))) variants.push_back(v);
  std::vector<ExpertLayout> layouts;
  for (ExpertLayout l : {ExpertLayout::EKN, ExpertLayout::ENK})
    if (T.claims_layout(ops::to_string(l))) layouts.push_back(l);

  bool first_combo = true;
  for (const auto& dtype : T.dtypes)
    for (const auto& variant : variants)
      for (ExpertLayout layout : layouts) {
        const Combo c{dtype, variant, layout};
        // Quick grid: the first (dtype, format, layout) gets every edge shape with three variants (and the
        // main shape with all); the other combinations the main shape (plain and noncontig+out) and the
        // zero-token shape with gates. The full grid runs every shape with every variant everywhere.
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          const Shape s = fit(shapes[i], variant);
          for (std::size_t j = 0; j < all_variants().size(); ++j) {
            const Variant& v = all_variants()[j];
            bool run = !T.quick;
            if (first_combo) run = run || i == 0 || j == 0 || j == 2 || j == 4;
            else run = run || (i == 0 && (j == 0 || j == 4)) || (shapes[i].routing == "zero_tokens" && j == 2);
            if (!run) continue;
            forward_case(cases, c, s, v);
            backward_case(cases, c, s, v);
          }
        }
        if (!T.quick)
          for (const Shape& b : big)
            for (const Variant& v : all_variants()) {
              forward_case(cases, c, fit(b, variant), v);
              backward_case(cases, c, fit(b, variant), v);
            }
        determinism_case(cases, c);
        repeat_case(cases, c);
        if (first_combo || !T.quick) bad_input_cases(cases, c);
        if (variant == "dense" && layout == ExpertLayout::EKN) large_case(cases, c);
        first_combo = false;
      }
  weight_cache().clear();
}

}  // namespace ax::conformance::detail
