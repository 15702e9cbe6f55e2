// fused_attn_bench: the fused_attn kernels against the reference backend and the eager ATen composites
// (what transformers runs), fwd+bwd, on the current CUDA device. Prints one JSON object.
//
//   fused_attn_bench [--iters 50] [--warmup 10] [--skip-linear-ce]
//
// (a) norm_rope q [1, 4096, 32, 128] bf16: fused vs reference vs eager (fp32 rms, ·w, rotate_half, cat);
//     the fused pair also forward and backward alone, and replayed from a CUDA graph (kernel time only)
// (b) linear_ce T=4096, H=4096, V=151936 bf16: fused (chunked) with the gradient in the forward
//     (grad_in_forward: what training runs, 2 GEMMs) and with the recomputing backward (3 GEMMs) vs
//     unfused (bf16 logits [T, V], .float(), at::cross_entropy_loss; backward by the explicit softmax
//     formula, 2 GEMMs) — ms and peak memory of each
// (c) rms_norm with residual [4096, 4096] and swiglu [4096, 12288] bf16 vs their eager composites
// (d) attention, causal bf16 fwd+bwd at the step benchmarks' shapes (and packed short samples): the cuDNN
//     backend vs the `aten` backend (LibTorch's varlen FlashAttention-2, as training runs it: deterministic
//     backward), both through their op interfaces; with the max abs differences between them and whether
//     two cuDNN runs are bitwise equal (when the build has the cuDNN backend)
// Times: CUDA events around each fwd+bwd on the current stream, median of --iters after --warmup.
// The kernels are called through the backends' bodies (src/backends.hpp), the reference through the
// registry; arguments are well-formed, so nothing is validated here.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <axengine/bench_result.hpp>
#include <axengine/cuda/bench_timer.hpp>
#include <axengine/engine.hpp>
#include <axengine/ops/norm_rope.hpp>
#include <axengine/strings.hpp>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "../src/backends.hpp"
#ifdef AXENGINE_WITH_CUDNN_ATTENTION
#include "../src/cudnn_attention.hpp"
#endif
#include "../src/plan.hpp"

namespace {

using nlohmann::json;
namespace fa = ax::fused_attn;

struct Timing {
  int iters = 50, warmup = 10;
};

double median_ms(const Timing& t, const std::function<void()>& f) { return ax::cuda::median_event_ms(f, t.iters, t.warmup); }

// The same work captured once in a CUDA graph and replayed: the kernels' own time, without the host's
// per-call work (argument views, allocations, launches) that eager timing includes when it is the longer
// side — what a training step captured by the compile plugin's graph executor sees.
double graph_median_ms(const Timing& t, const std::function<void()>& f) {
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(side);
    f();  // warm-up on the capture stream: lazy initialisation must not happen in capture
    side.synchronize();
    graph.capture_begin();
    f();
    graph.capture_end();
  }
  return median_ms(t, [&] { graph.replay(); });
}

// Peak bytes the caching allocator held above what was allocated before f (one call after a sync).
int64_t peak_extra_bytes(const std::function<void()>& f) {
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const int dev = at::cuda::current_device();
  at::cuda::getCurrentCUDAStream().synchronize();
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t before = alloc::getDeviceStats(dev).allocated_bytes[agg].current;
  alloc::resetPeakStats(dev);
  f();
  at::cuda::getCurrentCUDAStream().synchronize();
  return alloc::getDeviceStats(dev).allocated_bytes[agg].peak - before;
}

at::Tensor rotate_half(const at::Tensor& u) {
  const int64_t h = u.size(-1) / 2;
  return at::cat({-u.slice(-1, h), u.slice(-1, 0, h)}, -1);
}

json ratios(json j, const std::string& base, std::initializer_list<const char*> others) {
  for (const char* o : others)
    j[std::string("speedup_vs_") + o] = j[std::string(o) + "_ms"].get<double>() / j[base].get<double>();
  return j;
}

json bench_norm_rope(const Timing& t, const ax::Registry& registry) {
  const int64_t S = 4096, H = 32, D = 128;
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  ax::ops::NormRopeArgs a;
  a.x = at::randn({1, S, H, D}, bf);
  a.weight = at::rand({D}, bf) + 0.5;
  a.position_ids = at::arange(S, bf.dtype(at::kLong)).unsqueeze(0);
  a.inv_freq = at::pow(1e6, -at::arange(0, D, 2, bf.dtype(at::kFloat)) / static_cast<double>(D));
  const at::Tensor g = at::randn({1, S, H, D}, bf);
  ax::ops::NormRopeBackwardArgs b;
  b.grad_y = g;

  json j;
  j["shape"] = "q [1, 4096, 32, 128] bf16, position_ids + inv_freq, fwd+bwd (dx, dweight)";
  auto fused = [&] {
    fa::norm_rope_forward(a);
    fa::norm_rope_backward(a, b);
  };
  j["fused_ms"] = median_ms(t, fused);
  j["fused_fwd_ms"] = median_ms(t, [&] { fa::norm_rope_forward(a); });
  j["fused_bwd_ms"] = median_ms(t, [&] { fa::norm_rope_backward(a, b); });
  j["fused_graph_ms"] = graph_median_ms(t, fused);
  auto ref = registry.kernel<ax::ops::NormRope>("reference");
  j["reference_ms"] = median_ms(t, [&] {
    ref->forward(a);
    ref->backward(a, b);
  });
  // transformers: q_norm (fp32 statistics, weight · normed.to(bf16)), bf16 cos/sin, rotate_half + cat.
  j["eager_ms"] = median_ms(t, [&] {
    at::Tensor x = a.x.detach().requires_grad_(true), w = a.weight.detach().requires_grad_(true);
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor n = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16);
    at::Tensor h = w * n;
    at::Tensor freqs = a.position_ids.to(at::kFloat).unsqueeze(-1) * a.inv_freq;
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    at::Tensor cos = emb.cos().to(at::kBFloat16).unsqueeze(-2), sin = emb.sin().to(at::kBFloat16).unsqueeze(-2);
    at::Tensor y = h * cos + rotate_half(h) * sin;
    y.backward(g);
  });
  return ratios(j, "fused_ms", {"reference", "eager"});
}

json bench_linear_ce(const Timing& t) {
  const int64_t T = 4096, H = 4096, V = 151936;
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  ax::ops::LinearCeArgs a;
  a.h = at::randn({T, H}, bf);
  a.weight = at::randn({V, H}, bf) * 0.02;
  a.targets = at::randint(0, V, {T}, bf.dtype(at::kLong));
  a.targets.slice(0, 0, 64).fill_(-100);  // a prompt's ignored tokens
  a.check_values = false;
  const at::Tensor grad_loss = at::full({T}, 1.0 / T, bf.dtype(at::kFloat));
  const fa::Options opt;

  ax::ops::LinearCeArgs in_fwd = a;
  in_fwd.grad_in_forward = true;
  auto fused = [&] {  // the training path: the autograd adapter sets grad_in_forward
    ax::ops::LinearCeResult r = fa::linear_ce_forward(in_fwd, opt);
    ax::ops::LinearCeBackwardArgs b{grad_loss, r.lse, r.saved};
    fa::linear_ce_backward(in_fwd, b, opt);
  };
  auto fused_recompute = [&] {
    ax::ops::LinearCeResult r = fa::linear_ce_forward(a, opt);
    ax::ops::LinearCeBackwardArgs b{grad_loss, r.lse};
    fa::linear_ce_backward(a, b, opt);
  };
  auto unfused = [&] {
    at::Tensor logits = at::mm(a.h, a.weight.t()).to(at::kFloat);
    at::Tensor loss = at::cross_entropy_loss(logits, a.targets, {}, at::Reduction::None, -100);
    const at::Tensor ignored = a.targets.eq(-100);
    at::Tensor gl = grad_loss.masked_fill(ignored, 0).unsqueeze(1);
    at::Tensor p = at::softmax(logits, 1);
    p.scatter_add_(1, a.targets.clamp_min(0).unsqueeze(1), -at::ones({T, 1}, p.options()));
    at::Tensor dh = at::mm((p * gl).to(at::kBFloat16), a.weight);
  };
  json j;
  j["shape"] = "T=4096, H=4096, V=151936 bf16, fwd+bwd (dh)";
  j["chunk_rows"] = ax::fused_attn::plan::linear_ce_chunk_rows(T, V, 2, opt.linear_ce_chunk_mib << 20);
  {  // the two fused paths agree to rounding (the conformance suite holds each to the reference)
    ax::ops::LinearCeResult r = fa::linear_ce_forward(in_fwd, opt);
    const at::Tensor d1 = fa::linear_ce_backward(in_fwd, {grad_loss, r.lse, r.saved}, opt).to(at::kFloat);
    const at::Tensor d0 = fa::linear_ce_backward(a, {grad_loss, r.lse}, opt).to(at::kFloat);
    j["dh_rel_diff_grad_in_forward_vs_recompute"] = ((d1 - d0).norm() / d0.norm()).item<double>();
  }
  j["fused_ms"] = median_ms(t, fused);
  j["fused_recompute_ms"] = median_ms(t, fused_recompute);
  j["unfused_ms"] = median_ms(t, unfused);
  j["fused_peak_extra_mib"] = static_cast<double>(peak_extra_bytes(fused)) / (1 << 20);
  j["fused_recompute_peak_extra_mib"] = static_cast<double>(peak_extra_bytes(fused_recompute)) / (1 << 20);
  j["unfused_peak_extra_mib"] = static_cast<double>(peak_extra_bytes(unfused)) / (1 << 20);
  return ratios(j, "fused_ms", {"fused_recompute", "unfused"});
}

json bench_rms_norm(const Timing& t) {
  const int64_t T = 4096, H = 4096;
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  ax::ops::RmsNormArgs a;
  a.x = at::randn({T, H}, bf);
  a.residual = at::randn({T, H}, bf);
  a.weight = at::rand({H}, bf) + 0.5;
  const at::Tensor g = at::randn({T, H}, bf), gs = at::randn({T, H}, bf);
  json j;
  j["shape"] = "[4096, 4096] bf16 with residual, fwd+bwd (dx with grad_sum, dweight)";
  j["fused_ms"] = median_ms(t, [&] {
    ax::ops::RmsNormResult r = fa::rms_norm_forward(a);
    ax::ops::RmsNormBackwardArgs b;
    b.grad_y = g;
    b.grad_sum = gs;
    b.sum = r.sum;
    b.rstd = r.rstd;
    fa::rms_norm_backward(a, b);
  });
  j["eager_ms"] = median_ms(t, [&] {
    at::Tensor x = a.x.detach().requires_grad_(true), w = a.weight.detach().requires_grad_(true);
    at::Tensor s = x + a.residual;
    at::Tensor sf = s.to(at::kFloat);
    at::Tensor y = w * (sf * at::rsqrt(sf.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16);
    y.backward(g, /*retain_graph=*/true);  // then the residual stream's own gradient
    s.backward(gs);
  });
  return ratios(j, "fused_ms", {"eager"});
}

json bench_swiglu(const Timing& t) {
  const int64_t T = 4096, I = 12288;
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  ax::ops::SwigluArgs a;
  a.gate_up = at::randn({T, 2 * I}, bf);
  const at::Tensor g = at::randn({T, I}, bf);
  json j;
  j["shape"] = "gate_up [4096, 2 x 12288] bf16, fwd+bwd";
  j["fused_ms"] = median_ms(t, [&] {
    fa::swiglu_forward(a);
    fa::swiglu_backward(a, ax::ops::SwigluBackwardArgs{g});
  });
  j["eager_ms"] = median_ms(t, [&] {
    at::Tensor gu = a.gate_up.detach().requires_grad_(true);
    at::Tensor y = at::silu(gu.slice(1, 0, I)) * gu.slice(1, I);
    y.backward(g);
  });
  return ratios(j, "fused_ms", {"eager"});
}

}  // namespace

#ifdef AXENGINE_WITH_CUDNN_ATTENTION
// Sequence lengths summing to T: `n` equal ones, or a deterministic spread of short samples (64..512).
std::vector<int64_t> lengths(int64_t T, int64_t n) {
  std::vector<int64_t> out;
  if (n > 0) return std::vector<int64_t>(static_cast<size_t>(n), T / n);
  int64_t left = T;
  for (int64_t i = 0; left > 0; ++i) {
    const int64_t l = std::min(left, 64 + (i * 97) % 449);
    out.push_back(l);
    left -= l;
  }
  return out;
}

json bench_attention_case(const Timing& t, const ax::Registry& registry, const char* name, int64_t T, int64_t n,
                          int64_t Hq, int64_t Hkv, int64_t D) {
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const std::vector<int64_t> ls = lengths(T, n);
  std::vector<int32_t> cu{0};
  int64_t longest = 0;
  double flops = 0;
  for (int64_t l : ls) {
    cu.push_back(cu.back() + static_cast<int32_t>(l));
    longest = std::max(longest, l);
    flops += 2.0 * static_cast<double>(l) * static_cast<double>(l) * static_cast<double>(Hq * D);
  }
  ax::ops::AttentionArgs a;
  a.q = at::randn({T, Hq, D}, bf);
  a.k = at::randn({T, Hkv, D}, bf);
  a.v = at::randn({T, Hkv, D}, bf);
  a.cu_seqlens = at::tensor(cu, bf.dtype(at::kInt));
  a.max_seqlen = longest;
  a.check_values = false;
  const at::Tensor g = at::randn({T, Hq, D}, bf);
  auto fwd_bwd = [&](ax::ops::Attention& op) {
    ax::ops::AttentionResult r = op.forward(a);
    ax::ops::AttentionBackwardArgs b;
    b.grad_out = g;
    b.out = r.out;
    b.lse = r.lse;
    b.saved = r.saved;
    ax::ops::AttentionGrads d = op.backward(a, b);
    return std::make_tuple(r.out, d.dq, d.dk, d.dv);
  };
  auto cudnn = fa::make_cudnn_attention();
  auto flash = registry.kernel<ax::ops::Attention>("aten");
  json j;
  j["case"] = name;
  j["shape"] = ax::str("T=", T, " in ", ls.size(), " sequences (longest ", longest, "), Hq=", Hq, ", Hkv=", Hkv,
                       ", D=", D, ", causal, bf16, fwd+bwd");
  j["cudnn_ms"] = median_ms(t, [&] { fwd_bwd(*cudnn); });
  j["aten_flash_ms"] = median_ms(t, [&] { fwd_bwd(*flash); });
  // `flops` is one full l×l GEMM per sequence; causal fwd (2 GEMMs) + bwd (5) over half the matrix: 3.5×.
  j["cudnn_tflops"] = flops * 3.5 / (j["cudnn_ms"].get<double>() * 1e9);
  j["aten_flash_tflops"] = flops * 3.5 / (j["aten_flash_ms"].get<double>() * 1e9);
  auto [o1, dq1, dk1, dv1] = fwd_bwd(*cudnn);
  auto [o2, dq2, dk2, dv2] = fwd_bwd(*cudnn);
  auto [of, dqf, dkf, dvf] = fwd_bwd(*flash);
  j["cudnn_bitwise_repeatable"] = at::equal(o1, o2) && at::equal(dq1, dq2) && at::equal(dk1, dk2) && at::equal(dv1, dv2);
  auto diff = [](const at::Tensor& x, const at::Tensor& y) { return (x.to(at::kFloat) - y.to(at::kFloat)).abs().max().item<double>(); };
  j["max_abs_diff_vs_flash"] = {{"out", diff(o1, of)}, {"dq", diff(dq1, dqf)}, {"dk", diff(dk1, dkf)}, {"dv", diff(dv1, dvf)}};
  return ratios(j, "cudnn_ms", {"aten_flash"});
}

json bench_attention(const Timing& t, const ax::Registry& registry) {
  json j = json::array();
  j.push_back(bench_attention_case(t, registry, "moe bench 2x2048", 4096, 2, 16, 4, 64));
  j.push_back(bench_attention_case(t, registry, "moe bench, packed short samples", 4096, 0, 16, 4, 64));
  j.push_back(bench_attention_case(t, registry, "dense 1x2048", 2048, 1, 32, 8, 128));
  j.push_back(bench_attention_case(t, registry, "dense 2x4096", 8192, 2, 32, 8, 128));
  j.push_back(bench_attention_case(t, registry, "dense, packed short samples", 4096, 0, 32, 8, 128));
  j.push_back(bench_attention_case(t, registry, "dense 1x8192", 8192, 1, 32, 8, 128));
  return j;
}
#endif

int main(int argc, char** argv) try {
  Timing t;
  bool linear_ce = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc)
      t.iters = std::max(1, std::stoi(argv[++i]));
    else if (arg == "--warmup" && i + 1 < argc)
      t.warmup = std::max(0, std::stoi(argv[++i]));
    else if (arg == "--skip-linear-ce")
      linear_ce = false;
    else {
      std::cerr << "usage: fused_attn_bench [--iters 50] [--warmup 10] [--skip-linear-ce]\n";
      return 2;
    }
  }
  if (!at::hasCUDA()) {
    std::cerr << "fused_attn_bench: needs a CUDA device\n";
    return 1;
  }
  ax::StartOptions start;
  start.discover = false;  // the reference backends are built in
  auto engine = ax::Engine::start(start);
  json out;
  out["device"] = at::cuda::getCurrentDeviceProperties()->name;
  out["date"] = ax::utc_date_today();  // where and when, inside the file (docs/performance.md, "Citing results")
  out["iters"] = t.iters;
  out["norm_rope"] = bench_norm_rope(t, engine->registry);
  out["rms_norm"] = bench_rms_norm(t);
  out["swiglu"] = bench_swiglu(t);
  if (linear_ce) out["linear_ce"] = bench_linear_ce(t);
#ifdef AXENGINE_WITH_CUDNN_ATTENTION
  out["attention"] = bench_attention(t, engine->registry);
#endif
  std::cout << out.dump(2) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "fused_attn_bench: " << e.what() << "\n";
  return 1;
}
