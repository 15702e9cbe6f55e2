// See moe_block_bench.hpp. FLOPs count the base GEMMs of forward and dX plus every LoRA product; the
// floor is those FLOPs at 790 TFLOP/s (dense bf16 on an H200 as measured on this workplace). Timing and
// memory statistics go through ATen's device-generic accelerator API; the one CUDA-specific call is
// ATen's sleeping kernel (ATen/cuda/Sleep.h), which rests the GPU before a timed call.
#include "moe_block_bench.hpp"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/cuda/Sleep.h>
#include <c10/core/Event.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <tuple>

#include "axengine/profiler.hpp"
#include "axengine/error.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"

namespace ax::bench {
namespace {

struct Shape {
  std::string name;
  int64_t E, H, I, k;
  bool gpt_oss = false;  // per-expert biases on both projections, clamped GLU on interleaved gate/up
  // DeepSeek-V3 / GLM-4.5's router (scaling > 0; models/parts/group_topk_router.hpp): sigmoid scores plus a
  // correction bias choose within the topk_group best of n_group groups; the gates are the chosen sigmoids,
  // normalised, times routed_scaling_factor. Else top-k of the logits with softmax gates.
  int64_t n_group = 1, topk_group = 1;
  double scaling = 0.0;
  int64_t shared = 0;  // n_shared_experts: a dense GLU beside the block, the same for every backend (not timed)
};
const std::vector<Shape> kShapes = {
    {"qwen3-30b-a3b", 128, 2048, 768, 8},
    {"qwen3.5-35b-a3b", 256, 2048, 512, 8},
    {"olmoe", 64, 2048, 1024, 8},
    {"mixtral", 8, 4096, 14336, 2},
    {"gpt-oss-20b", 32, 2880, 2880, 4, true},
    // DeepSeek-V3 / Kimi K2 (config.json: n_routed_experts 256, hidden 7168, moe_intermediate 2048, top-8 of the
    // 4 best of 8 groups, routed_scaling_factor 2.5) and GLM-4.5-Air (128 experts, hidden 4096, moe_intermediate
    // 1408, top-8, one group, factor 1.0); one shared expert each.
    {"deepseek-v3", 256, 7168, 2048, 8, false, 8, 4, 2.5, 1},
    {"glm4.5-air", 128, 4096, 1408, 8, false, 1, 1, 1.0, 1},
    // Smoke shapes (CPU runs, CI): the code paths of the real ones at toy sizes. Not in the default set.
    {"tiny", 8, 64, 32, 2},
    {"tiny-gpt-oss", 8, 64, 32, 2, true},
    {"tiny-deepseek", 16, 64, 32, 4, false, 4, 2, 2.5, 1},
};

// The group-limited sigmoid choice of Shape::scaling's comment on router logits [T, E]: ids and gates [T, k].
std::pair<at::Tensor, at::Tensor> group_topk_sigmoid(const Shape& sh, const at::Tensor& logits) {
  const int64_t T = logits.size(0), per = sh.E / sh.n_group;
  const at::Tensor s = logits.sigmoid();
  const at::Tensor c = s + 0.1 * at::randn({sh.E}, logits.options());  // the correction bias: steers the choice only
  const at::Tensor group_score = std::get<0>(c.view({T, sh.n_group, per}).topk(2, -1)).sum(-1);  // best two each
  const at::Tensor kept = at::zeros_like(group_score).scatter_(1, std::get<1>(group_score.topk(sh.topk_group, 1)), 1.0);
  const at::Tensor idx = std::get<1>(c.masked_fill(kept.repeat_interleave(per, 1) == 0, -INFINITY).topk(sh.k, 1));
  const at::Tensor w = s.gather(1, idx);
  return {idx, w / w.sum(1, true) * sh.scaling};
}
bool is_smoke(const Shape& s) { return s.name.rfind("tiny", 0) == 0; }
constexpr double kPeakTflops = 790.0;

struct Inputs {
  int64_t T, M, E, H, I, k, r;
  double s;
  bool gpt_oss;
  at::Tensor x, w1, w2, a1, b1, a2, b2, gates, dy;  // w1 [E, 2I, H], w2 [E, H, I] (HF layout, ENK)
  at::Tensor bias1, bias2;                          // gpt_oss: [E, 2I], [E, H]
  ax::ops::MoeRouting routing;
  ax::ops::WeightTensor q1, q2;  // quantised w1, w2 (format != dense; w1, w2 are then undefined)
  bool quantised = false;
};

// The weights in the benchmarked format; blocks run along K (the last dim of the ENK layout).
ax::ops::WeightTensor quantise(const at::Tensor& w, const std::string& format) {
  if (format == "nf4") return ax::ops::quantize_nf4(w, 64, false);
  if (format == "mxfp4") return ax::ops::quantize_mxfp4(w, 2);
  return ax::ops::quantize_nvfp4(w, 2, false);
}

// bf16 on CUDA; fp32 on the CPU (a smoke run: ATen's CPU GEMMs and _grouped_mm want fp32).
at::ScalarType bench_dtype(const at::Device& d) { return d.is_cuda() ? at::kBFloat16 : at::kFloat; }

Inputs make_inputs(const Shape& sh, int64_t T, int64_t r, const std::string& format, const at::Device& dev) {
  Inputs in{T, T * sh.k, sh.E, sh.H, sh.I, sh.k, r, 2.0, sh.gpt_oss};
  const auto o = at::TensorOptions().dtype(bench_dtype(dev)).device(dev);
  in.x = at::randn({T, sh.H}, o);
  in.w1 = at::randn({sh.E, 2 * sh.I, sh.H}, o).mul_(1.0 / std::sqrt(double(sh.H)));
  in.w2 = at::randn({sh.E, sh.H, sh.I}, o).mul_(1.0 / std::sqrt(double(sh.I)));
  in.a1 = at::randn({r * sh.E, sh.H}, o).mul_(1.0 / std::sqrt(double(sh.H)));
  in.b1 = at::randn({2 * sh.I, r * sh.E}, o).mul_(0.1);
  in.a2 = at::randn({r * sh.E, sh.I}, o).mul_(1.0 / std::sqrt(double(sh.I)));
  in.b2 = at::randn({sh.H, r * sh.E}, o).mul_(0.1);
  at::Tensor logits = at::randn({T, sh.E}, o.dtype(at::kFloat));
  at::Tensor idx;
  if (sh.scaling > 0) {
    at::Tensor w;
    std::tie(idx, w) = group_topk_sigmoid(sh, logits);
    in.gates = w.to(bench_dtype(dev));
  } else {
    at::Tensor vals;
    std::tie(vals, idx) = logits.topk(sh.k, 1);
    in.gates = vals.softmax(1).to(bench_dtype(dev));
  }
  if (sh.gpt_oss) {
    in.bias1 = at::randn({sh.E, 2 * sh.I}, o).mul_(0.1);
    in.bias2 = at::randn({sh.E, sh.H}, o).mul_(0.1);
  }
  at::Tensor flat = idx.reshape({-1});
  auto [se, ss] = flat.sort(true, 0, false);
  in.routing = ax::ops::MoeRouting{se, ss, at::bincount(flat, {}, sh.E).cumsum(0), sh.k};
  in.dy = at::randn({T, sh.H}, o);
  if (format != "dense") {
    in.q1 = quantise(in.w1, format);
    in.q2 = quantise(in.w2, format);
    in.w1 = at::Tensor();
    in.w2 = at::Tensor();
    in.quantised = true;
  }
  return in;
}

double block_flops(const Inputs& in) {
  auto proj = [&](double K, double N) {
    return 2.0 * 2.0 * in.M * K * N + 6.0 * in.M * in.r * (K + N);  // fwd + dX base; all LoRA products
  };
  return proj(in.H, 2.0 * in.I) + proj(in.I, in.H);
}

struct Outputs {
  at::Tensor y, dx, da1, db1, da2, db2, dgates;
};

// SiLU·up of h = [gate | up] ([M, 2I]), shared by both blocks. Written as one autograd node whose
// backward fills dh's two halves with out= ops: autograd through `silu(narrow) * narrow` instead zero-fills
// an [M, 2I] gradient per narrow and adds them, ~0.5 ms more per mixtral block in both blocks and up to
// 450 MB more peak memory (measured on H200, 2026-11-21). It still takes ~2.1 ms there: the halves are
// strided views, which ATen's elementwise kernels do not vectorise.
struct SwiGlu : torch::autograd::Function<SwiGlu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    const int64_t I = h.size(1) / 2;
    return at::silu(h.narrow(1, 0, I)).mul_(h.narrow(1, I, I));
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor& dact = grads[0];
    const int64_t I = h.size(1) / 2;
    const at::Tensor g = h.narrow(1, 0, I), u = h.narrow(1, I, I);
    at::Tensor dh = at::empty_like(h);
    at::Tensor dg = dh.narrow(1, 0, I), du = dh.narrow(1, I, I);
    at::Tensor tmp = at::silu(g);
    at::mul_out(du, dact, tmp);                // d up   = dact · silu(gate)
    at::mul_out(tmp, dact, u);                 // d silu = dact · up
    at::silu_backward_out(dg, tmp, g);         // d gate = d silu · silu'(gate)
    return {dh};
  }
};
at::Tensor swiglu(const at::Tensor& h) { return SwiGlu::apply(h); }

// The activation settings of the block: SiLU·up on halves, or gpt-oss's clamped GLU on interleaved columns.
ax::ops::MoeMlpArgs glu_args(const Inputs& in) {
  ax::ops::MoeMlpArgs a;
  a.activation = in.gpt_oss ? ax::ops::MoeActivation::clamped_glu : ax::ops::MoeActivation::silu_glu;
  a.packing = in.gpt_oss ? ax::ops::GluPacking::interleaved : ax::ops::GluPacking::halves;
  return a;  // alpha 1.702, limit 7.0: gpt-oss's
}

// The block as one moe.mlp call (forward, then backward with its saved tensors).
Outputs run_mlp(ax::ops::MoeMlp& be, const Inputs& in) {
  using namespace ax::ops;
  MoeMlpArgs a = glu_args(in);
  a.x = in.x;
  a.routing = in.routing;
  a.gates = in.gates;
  a.gate_up = in.quantised ? in.q1 : WeightTensor::dense(in.w1);
  a.down = in.quantised ? in.q2 : WeightTensor::dense(in.w2);
  a.layout = ExpertLayout::ENK;
  a.gate_up_bias = in.bias1;
  a.down_bias = in.bias2;
  a.gate_up_lora = {in.a1, in.b1, in.s};
  a.down_lora = {in.a2, in.b2, in.s};
  a.check_values = false;
  MoeMlpResult r = be.forward(a);
  MoeMlpBackwardArgs b;
  b.grad_y = in.dy;
  b.saved = r.saved;
  MoeMlpGrads g = be.backward(a, b);
  return {r.y, g.dx, g.dgate_up_lora_a, g.dgate_up_lora_b, g.ddown_lora_a, g.ddown_lora_b, g.dgates};
}

// The block through a moe.experts backend.
Outputs run_backend(ax::ops::MoeExperts& be, const Inputs& in) {
  using namespace ax::ops;
  MoeExpertsArgs p1;
  p1.x = in.x;
  p1.routing = in.routing;
  p1.weight = in.quantised ? in.q1 : WeightTensor::dense(in.w1);
  p1.layout = ExpertLayout::ENK;
  p1.lora_a = in.a1;
  p1.lora_b = in.b1;
  p1.scaling = in.s;
  p1.bias = in.bias1;
  p1.grouped_out = true;
  p1.check_values = false;
  MoeExpertsResult r1 = be.forward(p1);  // h [M, 2I], grouped
  // SiLU·up through the same autograd node as the _grouped_mm block, so both measure the same activation.
  // gpt-oss: moe.mlp's clamped GLU and its backward (the same functions the composed moe.mlp runs).
  at::Tensor h = r1.y.detach().requires_grad_(!in.gpt_oss);
  const MoeMlpArgs glu = glu_args(in);
  at::Tensor act = in.gpt_oss ? moe_glu(r1.y, glu) : swiglu(h);
  MoeExpertsArgs p2;
  p2.x = act.detach();
  p2.routing = in.routing;
  p2.weight = in.quantised ? in.q2 : WeightTensor::dense(in.w2);
  p2.layout = ExpertLayout::ENK;
  p2.lora_a = in.a2;
  p2.lora_b = in.b2;
  p2.scaling = in.s;
  p2.bias = in.bias2;
  p2.gates = in.gates;
  p2.grouped_in = true;
  p2.check_values = false;
  MoeExpertsResult r2 = be.forward(p2);  // y [T, H]

  MoeExpertsBackwardArgs b2;
  b2.grad_y = in.dy;
  b2.saved = r2.saved;
  MoeExpertsGrads g2 = be.backward(p2, b2);
  at::Tensor dh;
  if (in.gpt_oss) {
    dh = moe_glu_backward(r1.y, g2.dx, glu);
  } else {
    act.backward(g2.dx);
    dh = h.grad();
  }
  MoeExpertsBackwardArgs b1;
  b1.grad_y = dh;
  b1.saved = r1.saved;
  MoeExpertsGrads g1 = be.backward(p1, b1);
  return {r2.y, g1.dx, g1.dlora_a, g1.dlora_b, g2.dlora_a, g2.dlora_b, g2.dgates};
}

// The same block with at::_grouped_mm and autograd.
Outputs run_grouped_mm(const Inputs& in) {
  const int64_t E = in.E, r = in.r, H = in.H, I = in.I;
  auto leaf = [](const at::Tensor& t) { return t.detach().requires_grad_(true); };
  at::Tensor x = leaf(in.x), a1 = leaf(in.a1), b1 = leaf(in.b1), a2 = leaf(in.a2), b2 = leaf(in.b2),
             gates = leaf(in.gates);
  const at::Tensor& ss = in.routing.sorted_scattered_idxs;
  at::Tensor tok = ss.div(in.k, "floor");
  at::Tensor offs = in.routing.expert_offsets.to(at::kInt);
  auto gmm = [&](const at::Tensor& a, const at::Tensor& b) { return at::_grouped_mm(a, b, offs); };
  // Quantised runs: every expert dequantised to bf16 once per call (the memory and time a
  // dequantise-then-GEMM block spends), the same numbers the in-loop decoders produce.
  const at::Tensor w1 = in.quantised ? ax::ops::dequantize(in.q1, in.x.scalar_type()) : in.w1;
  const at::Tensor w2 = in.quantised ? ax::ops::dequantize(in.q2, in.x.scalar_type()) : in.w2;
  at::Tensor xs = x.index_select(0, tok);
  at::Tensor h = gmm(xs, w1.transpose(1, 2)) +
                 in.s * gmm(gmm(xs, a1.view({E, r, H}).transpose(1, 2)), b1.view({2 * I, E, r}).permute({1, 2, 0}));
  at::Tensor eid = in.gpt_oss ? in.routing.sorted_expert_idxs : at::Tensor();  // expert of each grouped row
  at::Tensor act;
  if (in.gpt_oss) {  // transformers' GptOssExperts, autograd through ATen
    h = h + in.bias1.index_select(0, eid);
    const double limit = 7.0, alpha = 1.702;
    at::Tensor g = h.slice(1, 0, 2 * I, 2).clamp_max(limit), u = h.slice(1, 1, 2 * I, 2).clamp(-limit, limit);
    act = (u + 1) * (g * at::sigmoid(g * alpha));
  } else {
    act = swiglu(h);
  }
  at::Tensor ys = gmm(act, w2.transpose(1, 2)) +
                  in.s * gmm(gmm(act, a2.view({E, r, I}).transpose(1, 2)), b2.view({H, E, r}).permute({1, 2, 0}));
  if (in.gpt_oss) ys = ys + in.bias2.index_select(0, eid);
  ys = ys * gates.reshape({-1}).index_select(0, ss).unsqueeze(1);
  at::Tensor y = at::zeros({in.T, H}, ys.options()).index_add(0, tok, ys);
  y.backward(in.dy);
  return {y.detach(), x.grad(), a1.grad(), b1.grad(), a2.grad(), b2.grad(), gates.grad()};
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return -1;
  at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  return (af - bf).norm().item<double>() / std::max(bf.norm().item<double>(), 1e-30);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `iters` calls, each timed by events, with no synchronisation until the end; with `rest_ms` > 0 each
// call waits behind a sleeping kernel of about that long, during which the host queues it: ms[call].
std::vector<double> timed_calls(const std::function<Outputs()>& fn, int iters, double rest_ms, bool cuda) {
  if (!cuda) {  // CPU smoke: wall clock per call, no rest
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      { Outputs o = fn(); }
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return ms;
  }
  const int dev = 0;
  const c10::Stream stream = at::accelerator::getCurrentStream(dev);
  std::vector<c10::Event> start, stop;
  for (int i = 0; i < iters; ++i) {
    start.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    stop.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
  for (int i = 0; i < iters; ++i) {
    if (rest_ms > 0) at::cuda::sleep(static_cast<int64_t>(rest_ms * 2e6));  // ~2 GHz SM clock when idle
    start[i].record(stream);
    { Outputs o = fn(); }
    stop[i].record(stream);
  }
  at::accelerator::synchronizeDevice(dev);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(start[i].elapsedTime(stop[i]));
  return ms;
}

struct Timing {
  double ms = 0, ms_sustained = 0, first_s = 0, peak_extra_mb = 0;
};

// The first call (module load, workspace and cuBLAS/CUTLASS set-up, any tuning) is timed on its own by
// wall clock and returned in `first`; then warm-up and two series of `iters` event-timed calls:
// - ms, rested: each call starts on a GPU that has idled for 10 ms (a sleeping kernel, so the host has
//   queued the call by then and no launch latency is timed). Every backend starts from the same state.
// - ms_sustained: the calls back to back, as triton.testing.do_bench runs them.
// The two differ where a block holds the GPU at its power limit (an H200 at 700 W under the mixtral
// blocks): under sustained load the clock falls and hunts (1260-1980 MHz), moving a block's time by up
// to 17% within a series, more for the block with the denser kernels. Rested times repeat within ~0.3%.
Timing time_block(const std::function<Outputs()>& fn, int iters, Outputs& first, bool cuda) {
  Timing t;
  const int dev = 0;
  if (!cuda) {  // CPU smoke: the same series by wall clock, no device memory statistics
    auto t0 = std::chrono::steady_clock::now();
    first = fn();
    t.first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.ms = median(timed_calls(fn, iters, 0.0, false));
    t.ms_sustained = t.ms;
    return t;
  }
  at::accelerator::synchronizeDevice(dev);
  auto t0 = std::chrono::steady_clock::now();
  first = fn();
  at::accelerator::synchronizeDevice(dev);
  t.first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < 3; ++i) fn();
  at::accelerator::synchronizeDevice(dev);
  const auto agg = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
  at::accelerator::resetPeakStats(dev);
  const int64_t before = at::accelerator::getDeviceStats(dev).allocated_bytes[agg].current;
  t.ms = median(timed_calls(fn, iters, 10.0, true));
  t.ms_sustained = median(timed_calls(fn, iters, 0.0, true));
  t.peak_extra_mb = double(at::accelerator::getDeviceStats(dev).allocated_bytes[agg].peak - before) / (1024.0 * 1024.0);
  return t;
}

}  // namespace


std::vector<std::string> moe_bench_shapes() {
  std::vector<std::string> names;
  for (const auto& s : kShapes) names.push_back(s.name);
  return names;
}

nlohmann::json run_moe_bench(const Registry& registry, const MoeBenchOptions& opt) {
  for (const auto& s : opt.shapes)
    if (std::none_of(kShapes.begin(), kShapes.end(), [&](const Shape& k) { return k.name == s; }))
      throw UsageError(str("bench moe: unknown shape '", s, "' (known: ", join(moe_bench_shapes(), ", "), ")"));
  if (opt.tokens < 1 || opt.rank < 1 || opt.iters < 1)
    throw UsageError("bench moe: --tokens, --rank and --iters must be >= 1");
  if (opt.format != "dense" && opt.format != "nf4" && opt.format != "mxfp4" && opt.format != "nvfp4")
    throw UsageError(str("bench moe: unknown format '", opt.format, "' (known: dense, nf4, mxfp4, nvfp4)"));
  if (opt.device != "cuda" && opt.device != "cpu")
    throw UsageError(str("bench moe: unknown device '", opt.device, "' (known: cuda, cpu)"));
  const bool cuda = opt.device == "cuda";
  if (cuda && (!at::hasCUDA() || at::accelerator::deviceCount() == 0))
    throw UsageError("bench moe: needs a CUDA device (none is visible; --device cpu runs a smoke test)");
  const at::Device dev = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const auto& shapes = opt.shapes;
  std::vector<std::string> backends = opt.backends;
  if (backends.empty()) backends = {"grouped_mm", "scattermoe", "mlp:sonicmoe", "mlp:scattermoe", "reference"};
  const int64_t tokens = opt.tokens, rank = opt.rank;
  const int iters = opt.iters;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("expert weights: %s%s\n", opt.format.c_str(),
              opt.format == "dense" ? (cuda ? " (bf16)" : " (fp32, CPU smoke run)")
                                    : " (moe.experts / moe.mlp backends; _grouped_mm dequantises per call)");
  std::printf("%-16s %-11s %9s %8s %7s %10s %9s %8s %9s %10s %8s\n", "shape", "backend", "ms", "TFLOP/s", "%floor",
              "peak+MB", "first_s", "speedup", "rel_err", "sustained", "speedup");
  for (const Shape& sh : kShapes) {
    if (shapes.empty() ? is_smoke(sh) : std::find(shapes.begin(), shapes.end(), sh.name) == shapes.end()) continue;
    at::manual_seed(0);
    Inputs in = make_inputs(sh, tokens, rank, opt.format, dev);
    const double flops = block_flops(in);
    const double floor_ms = flops / (kPeakTflops * 1e12) * 1e3;
    Outputs ref = run_grouped_mm(in);  // the comparison point for every backend's numbers
    double gmm_ms = 0, gmm_sustained = 0;
    for (const auto& name : backends) {
      std::function<Outputs()> fn;
      if (name == "grouped_mm") {
        fn = [&] { return run_grouped_mm(in); };
      } else if (name.rfind("mlp:", 0) == 0) {  // the block as one moe.mlp call of that backend
        auto be = registry.kernel<ax::ops::MoeMlp>(name.substr(4));
        if (!be) {
          std::printf("%-16s %-11s not registered for moe.mlp (skipped)\n", sh.name.c_str(), name.c_str());
          continue;
        }
        fn = [be, &in] { return run_mlp(*be, in); };
      } else {
        auto be = registry.kernel<ax::ops::MoeExperts>(name);
        if (!be) {
          std::printf("%-16s %-11s not registered (skipped)\n", sh.name.c_str(), name.c_str());
          continue;
        }
        fn = [be, &in] { return run_backend(*be, in); };
      }
      Timing t;
      Outputs o;
      try {
        t = time_block(fn, iters, o, cuda);
      } catch (const std::exception& e) {
        std::printf("%-16s %-11s failed: %s\n", sh.name.c_str(), name.c_str(), e.what());
        continue;
      }
      if (name == "grouped_mm") gmm_ms = t.ms, gmm_sustained = t.ms_sustained;
      const double err = std::max({rel(o.y, ref.y), rel(o.dx, ref.dx), rel(o.da1, ref.da1), rel(o.db1, ref.db1),
                                   rel(o.da2, ref.da2), rel(o.db2, ref.db2), rel(o.dgates, ref.dgates)});
      const double tflops = flops / (t.ms * 1e-3) / 1e12;
      const double speedup = gmm_ms > 0 ? gmm_ms / t.ms : 0;
      const double speedup_sustained = gmm_sustained > 0 ? gmm_sustained / t.ms_sustained : 0;
      std::printf("%-16s %-11s %9.3f %8.1f %7.1f %10.1f %9.3f %8.2f %9.2e %10.3f %8.2f\n", sh.name.c_str(),
                  name.c_str(), t.ms, tflops, 100.0 * floor_ms / t.ms, t.peak_extra_mb, t.first_s, speedup, err,
                  t.ms_sustained, speedup_sustained);
      std::fflush(stdout);
      rows.push_back({{"shape", sh.name}, {"backend", name}, {"ms", t.ms}, {"tflops", tflops},
                      {"pct_of_floor", 100.0 * floor_ms / t.ms}, {"peak_extra_mb", t.peak_extra_mb},
                      {"first_call_s", t.first_s}, {"speedup_vs_grouped_mm", speedup},
                      {"max_rel_err_vs_grouped_mm", err}, {"ms_sustained", t.ms_sustained},
                      {"speedup_sustained_vs_grouped_mm", speedup_sustained}, {"tokens", tokens}, {"rank", rank},
                      {"format", opt.format}, {"device", opt.device},
                      {"router", sh.scaling > 0 ? "group_topk_sigmoid" : "topk_softmax"},
                      {"shared_experts_not_timed", sh.shared}});
      if (opt.profile && cuda) {
        Profiler prof;
        prof.start(/*cuda=*/true);
        for (int i = 0; i < 3; ++i) fn();
        at::accelerator::synchronizeDevice(0);
        std::printf("%s / %s, 3 iterations:\n%s", sh.name.c_str(), name.c_str(), prof.stop("").c_str());
      }
    }
  }
  return rows;
}

}  // namespace ax::bench
