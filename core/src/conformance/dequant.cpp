// Conformance cases for dequant (docs/ops/dequant.md): whole and selective dequantisation of nf4 (plain
// and double-quantised absmax), mxfp4 and nvfp4 (per-tensor and per-expert global scale) to each claimed
// dtype, within one unit roundoff of the reference; guard bands; determinism; bad input; 2^31.
#include <map>

#include "axengine/ops/dequant.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::Dequant;
using ops::DequantArgs;

struct Layout {
  std::vector<int64_t> shape;
  int64_t axis;  // blocked axis for mxfp4/nvfp4
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : shape) d.push_back(std::to_string(v));
    return ax::str("[", join(d, ","), "]", "/axis=", axis);
  }
};

// Shapes per format: the blocked axis must hold whole blocks (32 mx, 16 nv), nf4 whole 64-blocks per expert.
std::vector<Layout> layouts_for(const std::string& variant, bool quick) {
  const std::string f = base_format(variant);
  std::vector<Layout> l;
  if (f == "nf4") {
    l = {{{8, 64, 96}, -1}, {{1, 64, 3}, -1}, {{130, 64}, -1}, {{5, 17, 64}, -1}};
    if (!quick) l.push_back({{16, 256, 130}, -1});
  } else {
    const int64_t b = f == "mxfp4" ? 32 : 16;
    l = {{{8, 65, 2 * b}, -1}, {{6, 3 * b, 17}, 1}, {{1, 3, b}, -1}, {{130, 4 * b}, -1}};
    if (!quick) l.push_back({{16, 130, 8 * b}, -1});
  }
  return l;
}

std::string prefix(const std::string& phase, const std::string& dtype, const std::string& variant) {
  return ax::str("dequant/", phase, "/", dtype, "/", variant);
}

// Quantised weights by (shape, variant), shared by the cases of one target: quantising is the slow part.
std::map<std::string, ops::WeightTensor>& weight_cache() {
  static std::map<std::string, ops::WeightTensor> cache;
  return cache;
}

ops::WeightTensor make(const Layout& l, const std::string& variant, const std::string& name, unsigned seed) {
  const std::string key = l.name() + "/" + variant;
  if (auto it = weight_cache().find(key); it != weight_cache().end()) return it->second;
  (void)name;
  at::Generator g = case_generator(seed, "dequant/weight/" + key);
  at::Tensor w = at::randn(l.shape, g, at::kFloat);
  // A few large outliers per tensor so absmax / shared exponents vary from block to block.
  w.view(-1).narrow(0, 0, std::min<int64_t>(w.numel(), 7)).mul_(9.0);
  return weight_cache().emplace(key, make_weight(w, variant, l.axis, at::kFloat)).first->second;
}

void dequant_case(CaseRunner& cases, const std::string& dtype, const std::string& variant, const Layout& l,
                  const std::string& mode) {
  const Target& T = cases.target();
  const std::string name = ax::str(prefix("fwd", dtype, variant), "/", l.name(), "/", mode);
  if (mode != "whole" && l.shape.size() < 2) return;
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(dtype);
    ops::WeightTensor w = make(l, variant, name, T.seed);
    DequantArgs ra, ia;
    ra.weight = weight_to(w, T.reference_device);
    ia.weight = weight_to(w, T.device);
    ra.dtype = ia.dtype = dt;
    if (mode == "selective") {
      // Out of order, with a repeat, last expert included.
      const int64_t E = l.shape[0];
      at::Tensor ex = at::tensor(std::vector<int64_t>{E - 1, 0, E / 2, E - 1}, at::kLong);
      ra.experts = ex.to(T.reference_device);
      ia.experts = ex.to(T.device);
    } else if (mode == "selective_empty") {
      ra.experts = at::empty({0}, at::TensorOptions().dtype(at::kLong).device(T.reference_device));
      ia.experts = at::empty({0}, at::TensorOptions().dtype(at::kLong).device(T.device));
    }
    at::Tensor want = T.ref<Dequant>().dequantize(ra);
    std::optional<GuardedOut> out;
    if (mode == "out") {
      out.emplace(want.sizes(), dt, T.device);
      ia.out = out->view();
    }
    InputGuard guard;
    guard.add("weight.codes", ia.weight.codes);
    guard.add("weight.scales", ia.weight.scales);
    guard.add("weight.nested_scales", ia.weight.nested_scales);
    guard.add("weight.global_scale", ia.weight.global_scale);
    guard.add("experts", ia.experts);
    at::Tensor got = T.impl<Dequant>().dequantize(ia);
    std::vector<std::string> msgs;
    if (out) msgs.push_back(out->check("out", got));
    msgs.push_back(check_close("y", got, want.to(T.device), tolerance(dtype).dequant));
    msgs.push_back(guard.check());
    return join(msgs, "; ");
  });
}

void determinism_case(CaseRunner& cases, const std::string& dtype, const std::string& variant) {
  const Target& T = cases.target();
  const Layout l = layouts_for(variant, true).front();
  const std::string name = ax::str(prefix("determinism", dtype, variant), "/", l.name());
  cases.run(name, [&] {
    DequantArgs a;
    a.weight = weight_to(make(l, variant, name, T.seed), T.device);
    a.dtype = scalar_type(dtype);
    at::Tensor y1 = T.impl<Dequant>().dequantize(a);
    // Another weight in between: no state may carry over.
    DequantArgs b = a;
    b.weight = weight_to(make(layouts_for(variant, true)[1], variant, name + "B", T.seed), T.device);
    T.impl<Dequant>().dequantize(b);
    return check_bitwise("y", y1, T.impl<Dequant>().dequantize(a));
  });
}

void bad_input_cases(CaseRunner& cases, const std::string& dtype, const std::string& variant) {
  const Target& T = cases.target();
  const Layout l = layouts_for(variant, true).front();
  const std::string pre = prefix("badinput", dtype, variant);
  DequantArgs good;
  good.weight = weight_to(make(l, variant, pre, T.seed), T.device);
  good.dtype = scalar_type(dtype);
  auto call = [&](const DequantArgs& a) { T.impl<Dequant>().dequantize(a); };
  auto opt = at::TensorOptions().device(T.device);
  struct Bad {
    std::string what, argument;
    std::function<void()> fn;
  };
  std::vector<Bad> bad = {
      {"dense_weight", "weight", [&] { auto a = good; a.weight = ops::WeightTensor::dense(at::zeros({4, 4}, opt)); call(a); }},
      {"codes_size", "codes", [&] { auto a = good; a.weight.codes = a.weight.codes.flatten().narrow(0, 0, 10); call(a); }},
      {"codes_dtype", "codes", [&] { auto a = good; a.weight.codes = a.weight.codes.to(at::kInt); call(a); }},
      {"scales_size", "scales", [&] { auto a = good; a.weight.scales = a.weight.scales.flatten().narrow(0, 0, 1); call(a); }},
      {"output_dtype", "dtype", [&] { auto a = good; a.dtype = at::kInt; call(a); }},
      {"experts_dtype", "experts", [&] { auto a = good; a.experts = at::zeros({2}, opt.dtype(at::kFloat)); call(a); }},
      {"experts_out_of_range", "experts",
       [&] { auto a = good; a.experts = at::full({2}, l.shape[0], opt.dtype(at::kLong)); call(a); }},
      {"experts_negative", "experts", [&] { auto a = good; a.experts = at::full({1}, -1, opt.dtype(at::kLong)); call(a); }},
      {"out_shape", "out", [&] { auto a = good; a.out = at::empty({3}, opt.dtype(a.dtype)); call(a); }},
  };
  for (auto& b : bad) cases.run(ax::str(pre, "/", b.what), [&] { return check_throws_naming(b.argument, b.fn); });
}

// An output of more than 2^31 elements. CUDA only, when the GPU has room; nf4 codes drawn directly.
void large_case(CaseRunner& cases, const std::string& dtype) {
  const Target& T = cases.target();
  const int64_t rows = 2049, cols = int64_t{1} << 20;  // 2^31 + 2^20 elements
  const std::string name = ax::str(prefix("fwd", dtype, "nf4"), "/[", rows, ",", cols, "]/index_over_2^31");
  if (!T.device.is_cuda()) return cases.skip_case(name, "index products past 2^31 are checked on CUDA only");
  if (dtype == "fp32") return cases.skip_case(name, "run in bf16/fp16 only (half the memory)");
  const std::size_t need = static_cast<std::size_t>(rows) * cols * 2 * 2 + (std::size_t{3} << 30);
  if (cuda_free_bytes(T.device.index()) < need)
    return cases.skip_case(name, ax::str("needs ~", need >> 30, " GiB free on the GPU"));
  cases.run(name, [&] {
    auto dev = at::TensorOptions().device(T.device);
    ops::WeightTensor w;
    w.format = ops::WeightFormat::nf4;
    w.shape = {rows, cols};
    w.blocksize = 64;
    w.codes = at::randint(0, 256, {rows * cols / 2}, dev.dtype(at::kByte));
    w.scales = at::rand({rows * cols / 64}, dev.dtype(at::kFloat));
    DequantArgs a;
    a.weight = w;
    a.dtype = scalar_type(dtype);
    at::Tensor got = T.impl<Dequant>().dequantize(a);
    at::Tensor want = T.ref<Dequant>().dequantize(a);
    const double tol = tolerance(dtype).dequant;
    return join({check_close("y first rows", got.narrow(0, 0, 2), want.narrow(0, 0, 2), tol),
                 check_close("y last rows", got.narrow(0, rows - 2, 2), want.narrow(0, rows - 2, 2), tol)},
                "; ");
  });
}

}  // namespace

void run_dequant(CaseRunner& cases) {
  const Target& T = cases.target();
  weight_cache().clear();
  std::vector<std::string> variants;
  for (const char* v : {"nf4", "nf4-dq", "mxfp4", "nvfp4", "nvfp4-pe"})
    if (T.claims_format(base_format(v))) variants.push_back(v);
  for (const auto& dtype : T.dtypes) {
    for (const auto& variant : variants) {
      for (const Layout& l : layouts_for(variant, T.quick))
        for (const char* mode : {"whole", "selective", "selective_empty", "out"}) dequant_case(cases, dtype, variant, l, mode);
      determinism_case(cases, dtype, variant);
      bad_input_cases(cases, dtype, variant);
    }
    if (T.claims_format("nf4")) large_case(cases, dtype);
  }
  weight_cache().clear();
}

}  // namespace ax::conformance::detail
