// The conformance problems of moe.experts (docs/ops/moe.experts.md): forward Y and backward dX, dA, dB,
// dgates against the reference over a shape grid with the routing edge cases, per claimed dtype, weight
// format and layout; preallocated outputs; determinism; repeatability; bad input; 2^31. The checks are
// the suite's generic ones (suite.cpp); the exact zeros of inactive rows are this op's own.
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
struct Data {
  Shape s;
  ExpertLayout layout;
  at::Tensor x, w, lora_a, lora_b, bias, gates, grad;  // grad: for the variant's output shape
  MoeRouting routing;
};

MoeRouting make_routing(const Shape& s, at::Generator& g) { return moe_test_routing(s.E, s.k, s.T, s.routing, g); }

}  // namespace

MoeRouting moe_test_routing(int64_t E, int64_t k, int64_t T, const std::string& mode, at::Generator& g) {
  const Shape s{E, k, T, 0, 0, 0, mode};
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

namespace {

Data make_data(const Shape& s, ExpertLayout layout, const Variant& v, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  auto f32 = at::TensorOptions().dtype(at::kFloat);
  Data p{s, layout};
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

ops::WeightTensor weight_for(const Data& p, const std::string& variant, at::ScalarType dt) {
  const std::string key = ax::str(p.s.name(), "/", ops::to_string(p.layout), "/", variant, "/",
                                     variant == "dense" ? dtype_name(dt) : std::string("any"));
  auto& cache = weight_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_weight(p.w, variant, k_axis(p.layout), dt)).first;
  return it->second;
}

// The args one backend sees: cast to `dtype`, on `device`, optionally with non-contiguous tensors.
MoeExpertsArgs make_args(const Data& p, const Variant& v, const ops::WeightTensor& w32q, at::ScalarType dtype,
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

Tensors inputs_of(const MoeExpertsArgs& a) {
  return {{"x", a.x},
          {"sorted_expert_idxs", a.routing.sorted_expert_idxs},
          {"sorted_scattered_idxs", a.routing.sorted_scattered_idxs},
          {"expert_offsets", a.routing.expert_offsets},
          {"weight", a.weight.is_dense() ? a.weight.values : a.weight.codes},
          {"weight.scales", a.weight.scales},
          {"lora_a", a.lora_a},
          {"lora_b", a.lora_b},
          {"bias", a.bias},
          {"gates", a.gates}};
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
  std::string name() const { return ax::str(dtype, "/", variant, "/", ops::to_string(layout)); }
};

MoeExpertsGrads run_fwd_bwd(MoeExperts& op, const MoeExpertsArgs& a, const at::Tensor& grad, MoeExpertsGrads out = {}) {
  auto r = op.forward(a);
  MoeExpertsBackwardArgs b;
  b.grad_y = grad;
  b.saved = r.saved;
  b.out = out;
  return op.backward(a, b);
}

// One problem of a combination. phase "fwd": y; "bwd": dx, dlora_a, dlora_b, dgates (forward, then
// backward with its saved tensors); "fwd+bwd": all of them (determinism, repeat). `name` follows the
// combination's prefix: "<dtype>/<format variant>/<layout>/<shape>[/<variant>]".
Problem problem(const Suite& suite, const std::string& phase, const Combo& c, const Shape& shape, const Variant& v,
                const std::string& name) {
  Problem p;
  p.phase = phase;
  p.name = name;
  p.dtype = c.dtype;
  const std::string key = ax::str("moe.experts/", phase == "fwd+bwd" ? "both" : phase, "/", name);
  const unsigned seed = suite.seed();
  auto first = std::make_shared<const Data>(make_data(shape, c.layout, v, key, seed));
  const std::string variant = c.variant, dtype = c.dtype;
  p.bind = [=](const Bind& b) {
    auto d = b.draw ? std::make_shared<const Data>(make_data(shape, c.layout, v, key + "#1", seed)) : first;
    const at::ScalarType dt = scalar_type(dtype);
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<MoeExpertsArgs>(make_args(*d, v, weight_for(*d, variant, dt), dt, b.device, noncontig));
    if (b.for_graph) args->check_values = false;  // the value checks read the routing on the host
    at::Tensor grad = d->grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    Call call;
    call.inputs = inputs_of(*args);
    if (phase != "fwd") call.inputs.emplace_back("grad_y", grad);
    call.run = [args, grad, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<MoeExperts>();
      Tensors res;
      if (phase != "bwd") {
        MoeExpertsArgs a = *args;
        a.out = output(out, "y");
        res.emplace_back("y", op.forward(a).y);
      }
      if (phase != "fwd") {
        MoeExpertsGrads preset{output(out, "dx"), output(out, "dlora_a"), output(out, "dlora_b"), output(out, "dgates")};
        MoeExpertsGrads g = run_fwd_bwd(op, *args, grad, preset);
        res.insert(res.end(), {{"dx", g.dx}, {"dlora_a", g.dlora_a}, {"dlora_b", g.dlora_b}, {"dgates", g.dgates}});
      }
      return res;
    };
    return call;
  };
  const OpTolerance& tol = suite.spec().tolerance(c.dtype);
  if (phase == "fwd") {
    p.compare = {{"y", tol.forward}};
    if (v.out) p.preallocated = {"y"};
    if (!v.gates)
      p.extra = [first, v](const Tensors& got, const Tensors&) {
        // Rows of inactive entries (-1) must be exact zeros, not merely small.
        const MoeRouting& rt = first->routing;
        at::Tensor inactive = rt.sorted_expert_idxs.eq(-1);
        at::Tensor rows = v.grouped_out ? inactive.nonzero().flatten() : rt.sorted_scattered_idxs.masked_select(inactive);
        if (rows.numel() == 0) return std::string("y: no inactive routing entries");
        if (output(got, "y").detach().to(at::kCPU).index_select(0, rows).ne(0).any().item<bool>())
          fail("y: rows of inactive (-1) routing entries are not exactly zero");
        return ax::str("y: ", rows.numel(), " inactive rows exactly zero");
      };
  } else if (phase == "bwd") {
    p.compare = {{"dx", tol.backward}};
    if (v.out) p.preallocated = {"dx"};
    if (v.lora) {
      p.compare.insert(p.compare.end(), {{"dlora_a", tol.backward}, {"dlora_b", tol.backward}});
      if (v.out) p.preallocated.insert(p.preallocated.end(), {"dlora_a", "dlora_b"});
    }
    if (v.gates) {
      p.compare.push_back({"dgates", tol.backward});
      if (v.out) p.preallocated.push_back("dgates");
    }
  }
  return p;
}

Problem case_problem(const Suite& suite, const std::string& phase, const Combo& c, const Shape& shape, const Variant& v) {
  return problem(suite, phase, c, shape, v, ax::str(c.name(), "/", shape.name(), "/", v.name()));
}

// Two identical calls: bitwise identical y and grads (the contract promises determinism). Many tokens per
// expert, so a reduction in an unspecified order would change bits.
Problem determinism_problem(const Suite& suite, const Combo& c) {
  const Shape shape = fit({4, 2, 96, 40, 24, 4}, c.variant);
  return case_problem(suite, "fwd+bwd", c, shape, {.gates = true, .lora = true, .bias = true});
}

// Each bad input must throw an exception naming the argument at fault.
void bad_input_cases(Suite& suite, const Combo& c) {
  const Shape s = fit({4, 2, 6, 32, 16, 2}, c.variant);
  const Variant v{.gates = true, .lora = true, .bias = true};
  const at::ScalarType dt = scalar_type(c.dtype);
  const at::Device dev = suite.device();
  Data p = make_data(s, c.layout, v, ax::str("moe.experts/badinput/", c.name()), suite.seed());
  const MoeExpertsArgs good = make_args(p, v, weight_for(p, c.variant, dt), dt, dev, false);
  auto fwd = [](const Backend& be, const MoeExpertsArgs& a) { be.as<MoeExperts>().forward(a); };
  auto opt = at::TensorOptions().device(dev);
  using B = const Backend&;
  std::vector<BadInput> bad = {
      {"x_dtype", "x", [=](B be) { auto a = good; a.x = a.x.to(at::kInt); fwd(be, a); }},
      {"x_rank", "x", [=](B be) { auto a = good; a.x = a.x.unsqueeze(0); fwd(be, a); }},
      {"x_width", "x", [=](B be) { auto a = good; a.x = a.x.narrow(1, 0, s.K - 1); fwd(be, a); }},
      {"lora_a_shape", "lora_a", [=](B be) { auto a = good; a.lora_a = a.lora_a.narrow(0, 0, s.r * s.E - 1); fwd(be, a); }},
      {"lora_b_without_lora_a", "lora_a", [=](B be) { auto a = good; a.lora_a = at::Tensor(); fwd(be, a); }},
      {"lora_b_shape", "lora_b", [=](B be) { auto a = good; a.lora_b = a.lora_b.narrow(0, 0, s.N - 1); fwd(be, a); }},
      {"lora_dtype", "lora_a", [=](B be) { auto a = good; a.lora_a = a.lora_a.to(at::kDouble); fwd(be, a); }},
      {"bias_shape", "bias", [=](B be) { auto a = good; a.bias = a.bias.narrow(0, 0, s.E - 1); fwd(be, a); }},
      {"gates_shape", "gates", [=](B be) { auto a = good; a.gates = a.gates.narrow(1, 0, 1); fwd(be, a); }},
      {"expert_offsets_length", "expert_offsets",
       [=](B be) { auto a = good; a.routing.expert_offsets = a.routing.expert_offsets.narrow(0, 0, s.E - 1); fwd(be, a); }},
      {"expert_offsets_dtype", "expert_offsets",
       [=](B be) { auto a = good; a.routing.expert_offsets = a.routing.expert_offsets.to(at::kFloat); fwd(be, a); }},
      {"routing_lengths_mismatch", "sorted_scattered_idxs",
       [=](B be) { auto a = good; a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.narrow(0, 0, s.T * s.k - 1); fwd(be, a); }},
      {"expert_offsets_inconsistent", "expert_offsets",
       [=](B be) {
         auto a = good;
         a.routing.expert_offsets = a.routing.expert_offsets.clone();
         a.routing.expert_offsets[0] += 1;  // the ids say otherwise
         fwd(be, a);
       }},
      {"scattered_idx_out_of_range", "sorted_scattered_idxs",
       [=](B be) {
         auto a = good;
         a.routing.sorted_scattered_idxs = a.routing.sorted_scattered_idxs.clone();
         a.routing.sorted_scattered_idxs[0] = s.T * s.k + 5;
         fwd(be, a);
       }},
      {"expert_id_out_of_range", "sorted_expert_idxs",
       [=](B be) {
         auto a = good;
         a.routing.sorted_expert_idxs = a.routing.sorted_expert_idxs.clone();
         a.routing.sorted_expert_idxs[s.T * s.k - 1] = s.E;
         fwd(be, a);
       }},
      {"gates_with_grouped_out", "gates", [=](B be) { auto a = good; a.grouped_out = true; fwd(be, a); }},
      {"out_shape", "out", [=](B be) { auto a = good; a.out = at::empty({s.T + 1, s.N}, opt.dtype(dt)); fwd(be, a); }},
      {"grad_y_shape", "grad_y",
       [=](B be) {
         auto& op = be.as<MoeExperts>();
         auto r = op.forward(good);
         MoeExpertsBackwardArgs b;
         b.grad_y = at::zeros({s.T, s.N + 1}, opt.dtype(dt));
         b.saved = r.saved;
         op.backward(good, b);
       }},
  };
  if (at::hasCUDA()) {
    at::Device other = dev.is_cuda() ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0);
    bad.push_back({"x_device", "x", [=](B be) { auto a = good; a.x = a.x.to(other); fwd(be, a); }});
  } else {
    suite.skip(ax::str("moe.experts/badinput/", c.name(), "/x_device"), "needs a second device (no CUDA device present)");
  }
  suite.bad_inputs(c.name(), bad);
}

// Output rows x N > 2^31 elements: 32-bit index arithmetic overflows. CUDA only, when the GPU has room.
void large_case(Suite& suite, const Combo& c) {
  const at::Device device = suite.device();
  const int64_t N = 2048, K = 64, E = 4, k = 1;
  const int64_t Tt = (int64_t{1} << 31) / N + 64;  // T·k·N just past 2^31
  const Shape s{E, k, Tt, K, N, 0};
  const std::string name = ax::str("moe.experts/fwd/" + c.name(), "/", s.name(), "/index_over_2^31");
  if (!device.is_cuda()) return suite.skip(name, "index products past 2^31 are checked on CUDA only");
  const std::size_t need = static_cast<std::size_t>(Tt) * N * 2 * 2 * 3;  // y twice + slack, 2-byte dtype
  if (c.dtype == "fp32") return suite.skip(name, "run in bf16/fp16 only (half the memory)");
  if (cuda_free_bytes(device.index()) < need)
    return suite.skip(name, ax::str("needs ~", need >> 30, " GiB free on the GPU"));
  suite.custom(name, [&] {
    const at::ScalarType dt = scalar_type(c.dtype);
    auto dev = at::TensorOptions().device(device);
    at::Generator g = case_generator(suite.seed(), name);
    MoeExpertsArgs a;
    a.x = at::randn({Tt, K}, g, at::kFloat).to(device, dt);
    // Token t goes to expert t % E: offsets are easy, every expert busy.
    at::Tensor ex = at::arange(Tt, dev.dtype(at::kLong)) % E;
    auto sorted = ex.sort(/*stable=*/true, 0, false);
    a.routing.sorted_expert_idxs = std::get<0>(sorted);
    a.routing.sorted_scattered_idxs = std::get<1>(sorted);
    a.routing.expert_offsets = at::bincount(ex, {}, E).cumsum(0);
    a.routing.top_k = k;
    a.weight = weight_to(make_weight(at::randn({E, K, N}, g, at::kFloat) / 8.0, c.variant, 1, dt), device);
    a.layout = ExpertLayout::EKN;
    a.grouped_out = true;
    a.check_values = false;
    at::Tensor got = suite.backend().as<MoeExperts>().forward(a).y;
    // Compare the last rows (where a 32-bit offset would have wrapped) against the reference on them.
    const int64_t tail = 4096;
    MoeExpertsArgs ra = a;
    auto exr = at::arange(Tt - tail, Tt, dev.dtype(at::kLong)) % E;
    auto sr = exr.sort(true, 0, false);
    ra.x = a.x.narrow(0, Tt - tail, tail);
    ra.routing.sorted_expert_idxs = std::get<0>(sr);
    ra.routing.sorted_scattered_idxs = std::get<1>(sr);
    ra.routing.expert_offsets = at::bincount(exr, {}, E).cumsum(0);
    at::Tensor want = suite.reference().as<MoeExperts>().forward(ra).y;
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

void moe_experts_problems(Suite& suite) {
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
  for (const char* v : {"dense", "nf4", "nf4-dq", "mxfp4", "nvfp4", "nvfp4-pe", "fp8", "fp8-b8x16"})
    if (suite.claims_format(base_format(v))) variants.push_back(v);
  std::vector<ExpertLayout> layouts;
  for (ExpertLayout l : {ExpertLayout::EKN, ExpertLayout::ENK})
    if (suite.claims_layout(ops::to_string(l))) layouts.push_back(l);

  bool first_combo = true;
  for (const auto& dtype : suite.dtypes())
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
            bool run = !suite.quick();
            if (first_combo) run = run || i == 0 || j == 0 || j == 2 || j == 4;
            else run = run || (i == 0 && (j == 0 || j == 4)) || (shapes[i].routing == "zero_tokens" && j == 2);
            if (!run) continue;
            // The CUDA-graph check (graph-safe backends on CUDA): new inputs and a new routing per replay.
            const bool graph = (i == 0 && (j == 0 || j == 2)) || (shapes[i].routing == "zero_tokens" && j == 2);
            for (const char* phase : {"fwd", "bwd"}) {
              Problem p = case_problem(suite, phase, c, s, v);
              p.graph = graph;
              suite.accuracy(p);
            }
          }
        }
        if (!suite.quick())
          for (const Shape& b : big)
            for (const Variant& v : all_variants())
              for (const char* phase : {"fwd", "bwd"}) suite.accuracy(case_problem(suite, phase, c, fit(b, variant), v));
        suite.determinism(determinism_problem(suite, c));
        // A, then a different problem B, then A again: A's answers must not change (no state kept between
        // calls, e.g. a cache keyed on a pointer or a shape).
        const Shape sa = fit({8, 2, 17, 65, 130, 3}, variant), sb = fit({3, 1, 11, 32, 20, 2}, variant);
        const Variant rv{.lora = true, .bias = true};
        suite.repeat(problem(suite, "fwd+bwd", c, sa, rv, ax::str(c.name(), "/", sa.name())),
                     problem(suite, "fwd+bwd", c, sb, rv, sb.name()));
        if (first_combo || !suite.quick()) bad_input_cases(suite, c);
        if (variant == "dense" && layout == ExpertLayout::EKN) large_case(suite, c);
        first_combo = false;
      }
  weight_cache().clear();
}

}  // namespace ax::conformance::detail
