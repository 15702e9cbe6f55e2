// The conformance problems of dequant (docs/ops/dequant.md): whole and selective dequantisation of nf4
// (plain and double-quantised absmax), mxfp4 and nvfp4 (per-tensor and per-expert global scale) to each
// claimed dtype, within one unit roundoff of the reference; preallocated outputs; determinism; repeat;
// bad input; 2^31. The checks are the suite's generic ones (suite.cpp).
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
  } else if (f == "fp8") {  // blocks of the last two dims, any sizes (edge blocks are cut)
    l = {{{8, 65, 40}, -1}, {{1, 3, 16}, -1}, {{130, 64}, -1}, {{5, 17, 33}, -1}};
    if (!quick) l.push_back({{4, 300, 260}, -1});
  } else {
    const int64_t b = f == "mxfp4" ? 32 : 16;
    l = {{{8, 65, 2 * b}, -1}, {{6, 3 * b, 17}, 1}, {{1, 3, b}, -1}, {{130, 4 * b}, -1}};
    if (!quick) l.push_back({{16, 130, 8 * b}, -1});
  }
  return l;
}

// Quantised weights by (shape, variant), shared by the cases of one target: quantising is the slow part.
std::map<std::string, ops::WeightTensor>& weight_cache() {
  static std::map<std::string, ops::WeightTensor> cache;
  return cache;
}

// draw 1: other values of the same shapes (the CUDA-graph check's second input).
ops::WeightTensor make(const Layout& l, const std::string& variant, unsigned seed, int draw = 0) {
  const std::string key = l.name() + "/" + variant + (draw ? "#1" : "");
  if (auto it = weight_cache().find(key); it != weight_cache().end()) return it->second;
  at::Generator g = case_generator(seed, "dequant/weight/" + key);
  at::Tensor w = at::randn(l.shape, g, at::kFloat);
  // A few large outliers per tensor so absmax / shared exponents vary from block to block.
  w.view(-1).narrow(0, 0, std::min<int64_t>(w.numel(), 7)).mul_(9.0);
  return weight_cache().emplace(key, make_weight(w, variant, l.axis, at::kFloat)).first->second;
}

// mode: "whole", "selective" (experts out of order, with a repeat, the last included), "selective_empty",
// "out" (a preallocated output).
Problem problem(const Suite& suite, const std::string& dtype, const std::string& variant, const Layout& l,
                const std::string& mode) {
  Problem p;
  p.phase = "fwd";
  p.name = ax::str(dtype, "/", variant, "/", l.name(), mode.empty() ? "" : "/" + mode);
  p.dtype = dtype;
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    auto args = std::make_shared<DequantArgs>();
    args->weight = weight_to(make(l, variant, seed, b.draw), b.device);
    args->dtype = scalar_type(dtype);
    auto longs = at::TensorOptions().dtype(at::kLong).device(b.device);
    if (mode == "selective") {
      const int64_t E = l.shape[0];
      args->experts = at::tensor(std::vector<int64_t>{E - 1, 0, E / 2, E - 1}, at::kLong).to(b.device);
    } else if (mode == "selective_empty") {
      args->experts = at::empty({0}, longs);
    }
    if (b.for_graph) args->check_values = false;  // the value checks read `experts` on the host
    Call c;
    c.inputs = {{"weight.codes", args->weight.codes},
                {"weight.scales", args->weight.scales},
                {"weight.nested_scales", args->weight.nested_scales},
                {"weight.global_scale", args->weight.global_scale},
                {"experts", args->experts}};
    c.run = [args](const Backend& be, const Tensors& out) {
      DequantArgs a = *args;
      a.out = output(out, "y");
      return Tensors{{"y", be.as<Dequant>().dequantize(a)}};
    };
    return c;
  };
  p.compare = {{"y", suite.spec().tolerance(dtype).forward}};  // dequant's row: one rounding of a table value
  if (mode == "out") p.preallocated = {"y"};
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype, const std::string& variant) {
  const Layout l = layouts_for(variant, true).front();
  DequantArgs good;
  good.weight = weight_to(make(l, variant, suite.seed()), suite.device());
  good.dtype = scalar_type(dtype);
  auto call = [](const Backend& be, const DequantArgs& a) { be.as<Dequant>().dequantize(a); };
  auto opt = at::TensorOptions().device(suite.device());
  using B = const Backend&;
  return {
      {"dense_weight", "weight", [=](B be) { auto a = good; a.weight = ops::WeightTensor::dense(at::zeros({4, 4}, opt)); call(be, a); }},
      {"codes_size", "codes", [=](B be) { auto a = good; a.weight.codes = a.weight.codes.flatten().narrow(0, 0, 10); call(be, a); }},
      {"codes_dtype", "codes", [=](B be) { auto a = good; a.weight.codes = a.weight.codes.to(at::kInt); call(be, a); }},
      {"scales_size", "scales", [=](B be) { auto a = good; a.weight.scales = a.weight.scales.flatten().narrow(0, 0, 1); call(be, a); }},
      {"output_dtype", "dtype", [=](B be) { auto a = good; a.dtype = at::kInt; call(be, a); }},
      {"experts_dtype", "experts", [=](B be) { auto a = good; a.experts = at::zeros({2}, opt.dtype(at::kFloat)); call(be, a); }},
      {"experts_out_of_range", "experts",
       [=](B be) { auto a = good; a.experts = at::full({2}, l.shape[0], opt.dtype(at::kLong)); call(be, a); }},
      {"experts_negative", "experts", [=](B be) { auto a = good; a.experts = at::full({1}, -1, opt.dtype(at::kLong)); call(be, a); }},
      {"out_shape", "out", [=](B be) { auto a = good; a.out = at::empty({3}, opt.dtype(a.dtype)); call(be, a); }},
  };
}

// An output of more than 2^31 elements. CUDA only, when the GPU has room; nf4 codes drawn directly.
void large_case(Suite& suite, const std::string& dtype) {
  const at::Device device = suite.device();
  const int64_t rows = 2049, cols = int64_t{1} << 20;  // 2^31 + 2^20 elements
  const std::string name = ax::str(ax::str("dequant/fwd/", dtype, "/nf4"), "/[", rows, ",", cols, "]/index_over_2^31");
  if (!device.is_cuda()) return suite.skip(name, "index products past 2^31 are checked on CUDA only");
  if (dtype == "fp32") return suite.skip(name, "run in bf16/fp16 only (half the memory)");
  const std::size_t need = static_cast<std::size_t>(rows) * cols * 2 * 2 + (std::size_t{3} << 30);
  if (cuda_free_bytes(device.index()) < need)
    return suite.skip(name, ax::str("needs ~", need >> 30, " GiB free on the GPU"));
  suite.custom(name, [&] {
    auto dev = at::TensorOptions().device(device);
    ops::WeightTensor w;
    w.format = ops::WeightFormat::nf4;
    w.shape = {rows, cols};
    w.blocksize = 64;
    w.codes = at::randint(0, 256, {rows * cols / 2}, dev.dtype(at::kByte));
    w.scales = at::rand({rows * cols / 64}, dev.dtype(at::kFloat));
    DequantArgs a;
    a.weight = w;
    a.dtype = scalar_type(dtype);
    at::Tensor got = suite.backend().as<Dequant>().dequantize(a);
    at::Tensor want = suite.reference().as<Dequant>().dequantize(a);
    const double tol = suite.spec().tolerance(dtype).forward;
    return join({check_close("y first rows", got.narrow(0, 0, 2), want.narrow(0, 0, 2), tol),
                 check_close("y last rows", got.narrow(0, rows - 2, 2), want.narrow(0, rows - 2, 2), tol)},
                "; ");
  });
}

}  // namespace

void dequant_problems(Suite& suite) {
  weight_cache().clear();
  std::vector<std::string> variants;
  for (const char* v : {"nf4", "nf4-dq", "nf4-b16", "nf4-dq-b32", "mxfp4", "nvfp4", "nvfp4-pe", "fp8", "fp8-b8x16"})
    if (suite.claims_format(base_format(v))) variants.push_back(v);
  for (const auto& dtype : suite.dtypes()) {
    for (const auto& variant : variants) {
      const std::vector<Layout> layouts = layouts_for(variant, suite.quick());
      for (std::size_t i = 0; i < layouts.size(); ++i)
        for (const char* mode : {"whole", "selective", "selective_empty", "out"}) {
          // Selecting experts needs a dim before the blocked ones: 2 for fp8 (its blocks span the last two).
          if (std::string(mode) != "whole" && layouts[i].shape.size() < (base_format(variant) == "fp8" ? 3u : 2u)) continue;
          Problem p = problem(suite, dtype, variant, layouts[i], mode);
          p.graph = i == 0 && (std::string(mode) == "whole" || std::string(mode) == "selective");
          suite.accuracy(p);
        }
      // Two identical calls; and another weight in between: no state may carry over.
      const std::vector<Layout> quick = layouts_for(variant, true);
      suite.determinism(problem(suite, dtype, variant, quick[0], ""));
      Problem a = problem(suite, dtype, variant, quick[0], ""), b = problem(suite, dtype, variant, quick[1], "");
      b.name = quick[1].name();
      suite.repeat(a, b);
      suite.bad_inputs(ax::str(dtype, "/", variant), bad_inputs(suite, dtype, variant));
    }
    if (suite.claims_format("nf4")) large_case(suite, dtype);
  }
  weight_cache().clear();
}

}  // namespace ax::conformance::detail
