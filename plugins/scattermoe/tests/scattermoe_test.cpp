// scattermoe plugin parity: forward and backward against an fp64 formula of the moe.experts contract,
// over layouts, gates / grouped / scattered outputs, inactive routing entries, experts without tokens,
// sizes that are not multiples of any tile (element-load path) and ranks that are not powers of two.
// Quantised expert weights (nf4, nf4 double quant, mxfp4, nvfp4 with scalar / per-expert global scale):
// the packed path must give bitwise the same results as the dense path fed the dequantised weight (same
// tiles, same accumulation order: any decoding error shows), agree with the reference backend, and never
// read an expert without tokens (its scales are poisoned with NaN).
// The backend runs with the options AXENGINE_SCATTERMOE_TEST_OPTIONS gives (the body of a
// [kernels.options.scattermoe] table, bound through the plugin's own table: 'path = "split"',
// 'tile = "64x128,gram128x32"'), so one build checks every path and tile; unset: the defaults. This test reads
// the variable, never the plugin. Needs a CUDA device and the built plugin; skips (with a message) otherwise.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <dlfcn.h>
#include <unistd.h>
#include <doctest/doctest.h>

#include <axengine/ops/moe_experts.hpp>
#include <axengine/ops/quant.hpp>
#include <axengine/plugin.hpp>
#include <axengine/registry.hpp>
#include <axengine/builtins.hpp>
#include <axengine/conformance.hpp>
#include <axengine/plugin_loader.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "ops/reference/register.hpp"

namespace {

std::string test_options() {
  const char* v = std::getenv("AXENGINE_SCATTERMOE_TEST_OPTIONS");
  return v ? v : "";
}

// A fresh scattermoe backend, its table [kernels.options.scattermoe] bound from `options` (TOML) as the
// engine binds it from a run config.
std::shared_ptr<ax::ops::MoeExperts> load_scattermoe(const std::string& options = test_options()) {
  if (!at::hasCUDA() || at::detail::getCUDAHooks().deviceCount() == 0) return nullptr;
  std::string path = AXENGINE_PLUGIN_DIR;  // (operator+ here trips a GCC 12 -Wstringop-overflow false positive)
  path += "/axengine_scattermoe.so";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process' life
  if (!lib) return nullptr;
  auto fn = reinterpret_cast<ax::PluginRegisterFn*>(dlsym(lib, "axengine_plugin_register"));
  REQUIRE(static_cast<bool>(fn));
  ax::PluginRegistrar reg;
  fn(reg);
  REQUIRE(reg.staged().size() == 2);  // moe.experts, then moe.mlp composed from it
  REQUIRE(reg.staged()[0].op == "moe.experts");
  REQUIRE(reg.config_tables().size() == 1);
  REQUIRE(reg.config_tables()[0].path == "kernels.options.scattermoe");
  const toml::table table = toml::parse(std::string_view(options), std::string_view("AXENGINE_SCATTERMOE_TEST_OPTIONS"));
  ax::TableBinder binder(&table, "kernels.options.scattermoe", ax::BindContext{"AXENGINE_SCATTERMOE_TEST_OPTIONS"});
  reg.config_tables()[0].bind(binder);
  binder.finish();
  return std::static_pointer_cast<ax::ops::MoeExperts>(reg.staged()[0].object);
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor o = out.to(at::kCPU, at::kDouble), r = ref.to(at::kCPU, at::kDouble);
  if (!o.isfinite().all().item<bool>()) return 1e30;
  return (o - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
}

struct Case {
  int64_t T, K, N, E, k, r;
  ax::ops::ExpertLayout layout;
  bool gates, grouped_in, grouped_out, bias, inactive;
  at::ScalarType dtype = at::kBFloat16;
};

void run_case(ax::ops::MoeExperts& be, const Case& c) {
  using namespace ax::ops;
  const auto dev = at::Device(at::kCUDA, 0);
  const auto fo = at::TensorOptions().dtype(c.dtype).device(dev);
  const int64_t M = c.T * c.k;
  // Routing: top-k of random logits, one expert left without tokens when E > k.
  at::Tensor logits = at::randn({c.T, c.E}, at::TensorOptions().device(dev));
  if (c.E > c.k) logits.select(1, c.E - 1).fill_(-1e9);
  at::Tensor topk = std::get<1>(logits.topk(c.k, 1));        // [T, k]
  at::Tensor flat = topk.reshape({-1});
  auto [sorted_e, sorted_s] = flat.sort(/*stable=*/true, 0, false);
  at::Tensor offsets = at::bincount(flat, {}, c.E).cumsum(0);
  at::Tensor eid = sorted_e.clone();
  at::Tensor sid = sorted_s.clone();
  at::Tensor active = at::ones({M}, at::TensorOptions().dtype(at::kBool).device(dev));
  if (c.inactive) {  // every 5th entry belongs to another rank; its scattered index is garbage
    at::Tensor drop = at::arange(M, eid.options()).remainder(5).eq(2);
    eid.masked_fill_(drop, -1);
    sid.masked_fill_(drop, 1 << 30);
    active = drop.logical_not();
  }
  at::Tensor inv = at::argsort(sorted_s);                 // scattered entry s sits at sorted position inv[s]
  at::Tensor active_s = active.index_select(0, inv);      // whether scattered entry s is active

  const bool enk = c.layout == ExpertLayout::ENK;
  at::Tensor x_tok = at::randn({c.T, c.K}, fo);
  at::Tensor w = at::randn(enk ? std::vector<int64_t>{c.E, c.N, c.K} : std::vector<int64_t>{c.E, c.K, c.N}, fo)
                     .mul_(1.0 / std::sqrt(double(c.K)));
  at::Tensor la = c.r ? at::randn({c.r * c.E, c.K}, fo).mul_(1.0 / std::sqrt(double(c.K))) : at::Tensor();
  at::Tensor lb = c.r ? at::randn({c.N, c.r * c.E}, fo).mul_(0.5) : at::Tensor();
  at::Tensor bias = c.bias ? at::randn({c.E, c.N}, fo) : at::Tensor();
  at::Tensor gates = c.gates ? at::rand({c.T, c.k}, fo) : at::Tensor();
  const double s = 0.75;

  // ---- fp64 reference, entries in scattered order s = t·k + j
  auto D = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble).detach().requires_grad_(true) : t; };
  // grouped input: row p of X holds the token of entry p
  at::Tensor x_in = c.grouped_in ? x_tok.index_select(0, sorted_s.div(c.k, "floor")) : x_tok;
  at::Tensor xd = D(x_in), lad = D(la), lbd = D(lb), gd = D(gates);
  at::Tensor tok = at::arange(M, flat.options()).div(c.k, "floor");
  at::Tensor xs = xd.index_select(0, c.grouped_in ? inv : tok);        // [M, K], scattered order
  at::Tensor wd = w.to(at::kDouble);
  at::Tensor We = (enk ? wd.transpose(1, 2) : wd).index_select(0, flat);  // [M, K, N]
  at::Tensor ys = at::bmm(xs.unsqueeze(1), We).squeeze(1);
  if (c.r) {
    at::Tensor Ae = lad.view({c.E, c.r, c.K}).index_select(0, flat);                     // [M, r, K]
    at::Tensor Be = lbd.view({c.N, c.E, c.r}).permute({1, 0, 2}).index_select(0, flat);  // [M, N, r]
    at::Tensor xa = at::bmm(xs.unsqueeze(1), Ae.transpose(1, 2));                       // [M, 1, r]
    ys = ys + s * at::bmm(xa, Be.transpose(1, 2)).squeeze(1);
  }
  if (c.bias) ys = ys + bias.to(at::kDouble).index_select(0, flat);
  ys = ys * active_s.unsqueeze(1).to(at::kDouble);
  at::Tensor yref = c.gates ? (ys.view({c.T, c.k, c.N}) * gd.unsqueeze(-1)).sum(1)
                            : (c.grouped_out ? ys.index_select(0, sorted_s) : ys);
  at::Tensor gy = at::randn(yref.sizes(), fo);
  yref.backward(gy.to(at::kDouble));

  // ---- the plugin
  MoeExpertsArgs a;
  a.x = x_in;
  a.routing = MoeRouting{eid, sid, offsets, c.k};
  a.weight = WeightTensor::dense(w);
  a.layout = c.layout;
  a.lora_a = la;
  a.lora_b = lb;
  a.scaling = s;
  a.bias = bias;
  a.gates = gates;
  a.grouped_in = c.grouped_in;
  a.grouped_out = c.grouped_out;
  a.check_values = true;
  MoeExpertsResult res = be.forward(a);
  CHECK(rel_err(res.y, yref) < 1e-2);
  MoeExpertsResult res2 = be.forward(a);
  CHECK(at::equal(res.y, res2.y));  // deterministic

  MoeExpertsBackwardArgs b;
  b.grad_y = gy;
  b.saved = res.saved;
  MoeExpertsGrads g = be.backward(a, b);
  CHECK(rel_err(g.dx, xd.grad()) < 1e-2);
  if (c.r) {
    CHECK(rel_err(g.dlora_a, lad.grad()) < 1e-2);
    CHECK(rel_err(g.dlora_b, lbd.grad()) < 1e-2);
  }
  if (c.gates) CHECK(rel_err(g.dgates, gd.grad()) < 1e-2);
  MoeExpertsGrads g2 = be.backward(a, b);
  if (g.dx.defined()) CHECK(at::equal(g.dx, g2.dx));
  if (c.r) CHECK(at::equal(g.dlora_a, g2.dlora_a));
  if (c.r) CHECK(at::equal(g.dlora_b, g2.dlora_b));
}

}  // namespace

TEST_CASE("scattermoe plugin matches the fp64 moe.experts formula (CUDA)") {
  auto be = load_scattermoe();
  if (!be) {
    MESSAGE("skipped: needs a CUDA device and the built scattermoe plugin");
    return;
  }
  using L = ax::ops::ExpertLayout;
  const Case cases[] = {
      // T, K, N, E, k, r, layout, gates, grouped_in, grouped_out, bias, inactive
      {256, 128, 192, 8, 2, 16, L::EKN, true, false, false, false, false},
      {256, 128, 192, 8, 2, 16, L::ENK, true, false, false, false, false},
      {300, 136, 264, 8, 2, 16, L::ENK, false, false, true, true, false},
      {300, 136, 264, 8, 2, 16, L::EKN, false, false, false, true, true},
      {200, 100, 90, 6, 3, 5, L::EKN, true, false, false, true, true},   // element-load path
      {200, 100, 90, 6, 3, 5, L::ENK, false, true, false, false, false},
      {64, 64, 48, 4, 4, 8, L::ENK, true, false, false, false, true},   // k = E
      {1, 72, 24, 3, 1, 3, L::EKN, false, false, false, false, false},  // T = 1, thin N
      {512, 256, 512, 16, 4, 0, L::ENK, true, false, false, false, false},  // no LoRA
      // K and N of 1024+: the rank-r products XA and YB split K 4-5 ways (few row tiles), inactive rows
      {128, 1024, 1040, 4, 2, 16, L::ENK, true, false, false, false, true},
      // Ranks 24 and 32 (the split path's one-pass YB / dB kernel with four n-tiles); grouped output with
      // inactive rows whose incoming gradient is not zero
      {256, 256, 520, 4, 2, 32, L::EKN, false, false, true, false, true},
      {160, 128, 136, 4, 2, 24, L::ENK, true, false, false, false, false},
  };
  for (const auto& dtype : {at::kBFloat16, at::kHalf}) {
    for (const Case& c0 : cases) {
      Case c = c0;
      c.dtype = dtype;
      CAPTURE(c.T);
      CAPTURE(c.K);
      CAPTURE(c.N);
      CAPTURE(c.E);
      CAPTURE(c.k);
      CAPTURE(c.r);
      CAPTURE(static_cast<int>(c.layout));
      CAPTURE(c.gates);
      CAPTURE(c.grouped_in);
      CAPTURE(c.grouped_out);
      CAPTURE(static_cast<int>(dtype));
      run_case(*be, c);
    }
  }
}

namespace {

std::shared_ptr<ax::ops::MoeExperts> reference_backend() {
  static ax::Registry reg = [] {
    ax::Registry r;
    ax::ops::register_reference_kernels(r);
    return r;
  }();
  return reg.kernel<ax::ops::MoeExperts>("reference");
}

struct QuantCase {
  std::string variant;  // nf4, nf4-dq, mxfp4, nvfp4, nvfp4-pe
  int64_t T, K, N, E, k, r;
  ax::ops::ExpertLayout layout;
  bool gates, inactive;
};

ax::ops::WeightTensor quantise(const at::Tensor& w32, const std::string& v, int64_t k_axis) {
  using namespace ax::ops;
  if (v == "nf4") return quantize_nf4(w32, 64, false);
  if (v == "nf4-dq") return quantize_nf4(w32, 64, true);
  if (v == "mxfp4") return quantize_mxfp4(w32, k_axis);
  if (v == "nvfp4") return quantize_nvfp4(w32, k_axis, false);
  return quantize_nvfp4(w32, k_axis, true);
}

// NaN scales for expert e (it has no tokens: a backend that reads its weight produces NaN). nf4 double
// quant shares its nested scales between experts, so it is left alone there.
void poison_expert(ax::ops::WeightTensor& w, int64_t e) {
  using F = ax::ops::WeightFormat;
  if (w.format == F::nf4) {
    if (w.double_quant()) return;
    const int64_t per = w.numel() / w.shape[0] / w.blocksize;
    w.scales = w.scales.clone();
    w.scales.view({-1}).narrow(0, e * per, per).fill_(std::numeric_limits<float>::quiet_NaN());
  } else {
    at::Tensor s = w.scales.scalar_type() == at::kByte ? w.scales.clone() : w.scales.clone().view(at::kByte);
    s.select(0, e).fill_(w.format == F::mxfp4 ? 255 : 0x7f);  // E8M0 NaN, E4M3 NaN
    w.scales = w.scales.scalar_type() == at::kByte ? s : s.view(w.scales.scalar_type());
  }
}

void run_quant_case(ax::ops::MoeExperts& be, ax::ops::MoeExperts& ref, const QuantCase& c) {
  using namespace ax::ops;
  const auto dev = at::Device(at::kCUDA, 0);
  const auto fo = at::TensorOptions().dtype(at::kBFloat16).device(dev);
  const int64_t M = c.T * c.k;
  at::Tensor logits = at::randn({c.T, c.E}, at::TensorOptions().device(dev));
  logits.select(1, c.E - 1).fill_(-1e9);  // expert E-1 gets no token
  at::Tensor flat = std::get<1>(logits.topk(c.k, 1)).reshape({-1});
  auto [sorted_e, sorted_s] = flat.sort(/*stable=*/true, 0, false);
  at::Tensor offsets = at::bincount(flat, {}, c.E).cumsum(0);
  at::Tensor eid = sorted_e.clone(), sid = sorted_s.clone();
  if (c.inactive) {
    at::Tensor drop = at::arange(M, eid.options()).remainder(5).eq(2);
    eid.masked_fill_(drop, -1);
    sid.masked_fill_(drop, 1 << 30);
  }

  const bool enk = c.layout == ExpertLayout::ENK;
  at::Tensor w32 = at::randn(enk ? std::vector<int64_t>{c.E, c.N, c.K} : std::vector<int64_t>{c.E, c.K, c.N})
                       .mul_(1.0 / std::sqrt(double(c.K)));
  WeightTensor wq = quantise(w32, c.variant, enk ? 2 : 1).to(dev);
  poison_expert(wq, c.E - 1);
  // The dense twin: the same numbers, dequantised once to bf16 (a kernel decodes to exactly these).
  WeightTensor wd = WeightTensor::dense(dequantize(wq, at::kBFloat16));

  MoeExpertsArgs a;
  a.x = at::randn({c.T, c.K}, fo);
  a.routing = MoeRouting{eid, sid, offsets, c.k};
  a.layout = c.layout;
  if (c.r) {
    a.lora_a = at::randn({c.r * c.E, c.K}, fo).mul_(1.0 / std::sqrt(double(c.K)));
    a.lora_b = at::randn({c.N, c.r * c.E}, fo).mul_(0.5);
    a.scaling = 0.75;
  }
  if (c.gates) a.gates = at::rand({c.T, c.k}, fo);
  a.check_values = true;
  MoeExpertsArgs ad = a;
  a.weight = wq;
  ad.weight = wd;

  // The bitwise comparison holds between two runs of the fused kernels; with the split path forced
  // (option path = "split" or "split_gmm") the dense side's base product comes from another kernel.
  const std::string path = toml::parse(test_options())["path"].value_or(std::string("auto"));
  const bool same_kernels = path.rfind("split", 0) != 0;
  MoeExpertsResult yq = be.forward(a), yd = be.forward(ad), yr = ref.forward(a);
  CHECK(yq.y.isfinite().all().item<bool>());
  if (same_kernels) CHECK(at::equal(yq.y, yd.y));
  CHECK(rel_err(yq.y, yr.y) < 1e-2);

  MoeExpertsBackwardArgs b;
  b.grad_y = at::randn(yq.y.sizes(), fo);
  b.saved = yq.saved;
  MoeExpertsGrads gq = be.backward(a, b);
  b.saved = yd.saved;
  MoeExpertsGrads gd = be.backward(ad, b);
  b.saved = yr.saved;
  MoeExpertsGrads gr = ref.backward(a, b);
  CHECK(gq.dx.isfinite().all().item<bool>());
  if (same_kernels) CHECK(at::equal(gq.dx, gd.dx));
  CHECK(rel_err(gq.dx, gr.dx) < 1e-2);
  if (c.r) {
    CHECK(rel_err(gq.dlora_a, gr.dlora_a) < 1e-2);
    CHECK(rel_err(gq.dlora_b, gr.dlora_b) < 1e-2);
  }
  if (c.gates) CHECK(rel_err(gq.dgates, gr.dgates) < 1e-2);
}

}  // namespace

TEST_CASE("scattermoe decodes nf4 / mxfp4 / nvfp4 expert weights in the k loop (CUDA)") {
  auto be = load_scattermoe();
  if (!be) {
    MESSAGE("skipped: needs a CUDA device and the built scattermoe plugin");
    return;
  }
  auto ref = reference_backend();
  REQUIRE(ref);
  using L = ax::ops::ExpertLayout;
  struct Shape {
    int64_t T, K, N, E, k, r;
    bool gates, inactive;
  };
  const Shape shapes[] = {
      // T, K, N, E, k, r, gates, inactive
      {256, 128, 192, 8, 2, 16, true, false},  // aligned: the prefetching path, several k-tiles, fused LoRA
      {200, 128, 90, 6, 3, 5, false, true},    // N % 8 != 0: EKN takes the element-wise path
      {64, 64, 24, 4, 2, 0, true, false},      // thin output, no LoRA: the 128x16 tile
  };
  at::manual_seed(7);
  for (const char* variant : {"nf4", "nf4-dq", "mxfp4", "nvfp4", "nvfp4-pe"}) {
    for (L layout : {L::EKN, L::ENK}) {
      for (const Shape& sh : shapes) {
        const QuantCase c{variant, sh.T, sh.K, sh.N, sh.E, sh.k, sh.r, layout, sh.gates, sh.inactive};
        CAPTURE(c.variant);
        CAPTURE(static_cast<int>(c.layout));
        CAPTURE(c.K);
        CAPTURE(c.N);
        CAPTURE(c.r);
        run_quant_case(*be, *ref, c);
      }
    }
  }
  // K = 100 (nf4): a partial last k-tile, and in ENK stored rows that are not 8-element aligned (the
  // element-wise path); K = 80 (nvfp4): a partial last k-tile of blocked rows (EKN) or columns (ENK).
  for (L layout : {L::EKN, L::ENK}) {
    for (const QuantCase& c : {QuantCase{"nf4", 96, 100, 16, 4, 2, 4, layout, false, false},
                               QuantCase{"nvfp4", 96, 80, 40, 4, 2, 4, layout, true, true}}) {
      CAPTURE(c.variant);
      CAPTURE(static_cast<int>(layout));
      run_quant_case(*be, *ref, c);
    }
  }
}

TEST_CASE("scattermoe tunes into the tuning_cache file its options name (CUDA)") {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("axengine-scattermoe-tuning-" + std::to_string(::getpid()) + ".json");
  fs::remove(file);
  auto be = load_scattermoe("tune = true\ntuning_cache = \"" + file.string() + "\"\n");
  if (!be) {
    MESSAGE("skipped: needs a CUDA device and the built scattermoe plugin");
    return;
  }
  using L = ax::ops::ExpertLayout;
  run_case(*be, Case{256, 128, 192, 8, 2, 16, L::ENK, true, false, false, false, false});
  // Options tune and tuning_cache reached the backend: the tiles it timed are in that file.
  REQUIRE(fs::exists(file));
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(file));
  CHECK(doc["entries"].size() > 0);
  fs::remove(file);
}

// moe.mlp is scattermoe's moe.experts composed (ax::ops::compose_moe_mlp): the plugin stages it for the same
// requirements, and on a GPU it passes the moe.mlp conformance problems (quick grid, every claimed format).
TEST_CASE("scattermoe provides moe.mlp and passes its conformance problems (CUDA)") {
  if (!at::hasCUDA() || at::detail::getCUDAHooks().deviceCount() == 0) {
    MESSAGE("skipped: needs a CUDA device and the built scattermoe plugin");
    return;
  }
  auto registry = std::make_unique<ax::Registry>();
  ax::register_builtins(*registry);
  {
    ax::PluginLoader loader(*registry);
    const std::string path = std::string(AXENGINE_PLUGIN_DIR) + "/axengine_scattermoe.so";
    const ax::PluginReport& r = loader.load_file(path, "test");
    INFO(path << ": " << r.reason);
    REQUIRE(r.status == ax::PluginReport::Status::loaded);
    const ax::Provider* p = registry->find(ax::ProviderKind::kernel, "moe.mlp", "scattermoe");
    REQUIRE(p != nullptr);
    CHECK(p->info.needs.arch_min == 80);
    ax::conformance::Options o;
    o.op = "moe.mlp";
    o.backend = "scattermoe";
    o.device = "cuda";
    o.quick = true;
    ax::conformance::Report rep = ax::conformance::run(*registry, o);
    std::string fails;
    for (const auto& c : rep.cases)
      if (c.status == ax::conformance::Status::fail) fails += "\n  " + c.name + ": " + c.message;
    INFO("failing cases:" << fails);
    CHECK(rep.ok());
    CHECK(rep.count(ax::conformance::Status::pass) > 50);
    registry.reset();  // its objects' code lives in the plugin: gone before the loader unloads it
  }
}
