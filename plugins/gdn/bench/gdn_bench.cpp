// gdn_bench: linear_attention (the gated delta rule) of the gdn plugin's CUDA kernels against core's `aten`
// backend (the chunked form in ATen ops), on the current CUDA device, at Gated DeltaNet layer shapes:
//   fwd_ms        forward alone (out, no final state)
//   step_ms       forward + backward (dq, dk, dv, dg, dbeta)
//   rel_err       the largest norm-relative difference of out and the gradients, gdn vs aten
// Times: CUDA events around each call on the current stream, median of --iters after --warmup. The
// comparison with flash-linear-attention's chunk_gated_delta_rule is bench/fla_bench.py, which reads this
// file's rows and adds its own times (plugins/gdn/bench/gpu_job.sh runs both).
// Usage: gdn_bench [--shape NAME]... [--dtype bf16|fp16|fp32] [--iters N] [--warmup N] [--json FILE]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <axengine/bench_result.hpp>
#include <axengine/cuda/bench_timer.hpp>
#include <axengine/builtins.hpp>
#include <axengine/ops/linear_attention.hpp>
#include <axengine/registry.hpp>

#include "../src/linear_attention.hpp"

namespace {

using namespace ax::ops;

struct Shape {
  const char* name;
  std::vector<int32_t> seqlens;
  int64_t Hk, Hv, Dk, Dv;
};
// The linear-attention layer of Qwen3.5-35B-A3B (transformers' Qwen3_5MoeConfig defaults, = Qwen3-Next-80B-A3B's):
// 16 key heads, 32 value heads, head dims 128. Issue 38's target row is 4096 packed rows of mixed lengths;
// then one sequence of 4096 and of 16384 rows, 8 packed of 512, and Hv = Hk.
const std::vector<Shape> kShapes = {
    {"qwen3.5-moe-4096-mixed", {1800, 900, 700, 400, 200, 96}, 16, 32, 128, 128},
    {"qwen3.5-moe-1x4096", {4096}, 16, 32, 128, 128},
    {"qwen3.5-moe-8x512", {512, 512, 512, 512, 512, 512, 512, 512}, 16, 32, 128, 128},
    {"qwen3.5-moe-1x16384", {16384}, 16, 32, 128, 128},
    {"hk16-hv16-1x4096", {4096}, 16, 16, 128, 128},
};

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "bf16") return at::kBFloat16;
  if (s == "fp16") return at::kHalf;
  if (s == "fp32") return at::kFloat;
  throw std::runtime_error("--dtype must be bf16, fp16 or fp32, got " + s);
}

LinearAttentionArgs make_args(const Shape& s, at::ScalarType dt) {
  const auto o = at::TensorOptions().device(at::kCUDA);
  std::vector<int32_t> cu = {0};
  for (int32_t n : s.seqlens) cu.push_back(cu.back() + n);
  const int64_t T = cu.back();
  LinearAttentionArgs a;
  a.q = at::randn({T, s.Hk, s.Dk}, o).to(dt);
  a.k = at::randn({T, s.Hk, s.Dk}, o).to(dt);
  a.v = at::randn({T, s.Hv, s.Dv}, o).to(dt);
  // Qwen's g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b), with A_log ~ log U(0, 16) as initialised.
  a.g = -at::softplus(at::randn({T, s.Hv}, o)) * at::rand({s.Hv}, o) * 0.5;
  a.beta = at::sigmoid(at::randn({T, s.Hv}, o)).to(dt);
  a.cu_seqlens = at::tensor(cu, at::kInt).to(at::kCUDA);
  a.qk_l2norm = true;
  a.check_values = false;  // as training calls it: no host sync
  return a;
}

double median_ms(const std::function<void()>& f, int iters, int warmup) { return ax::cuda::median_event_ms(f, iters, warmup); }

double rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).norm() / y.norm().clamp_min(1e-30)).item<double>();
}

struct Run {
  double fwd_ms = 0, step_ms = 0;
  LinearAttentionResult r;
  LinearAttentionGrads g;
};

Run measure(LinearAttention& op, const LinearAttentionArgs& a, const LinearAttentionBackwardArgs& b, int iters,
            int warmup) {
  Run run;
  run.r = op.forward(a);
  LinearAttentionBackwardArgs bb = b;
  bb.saved = run.r.saved;
  run.g = op.backward(a, bb);
  run.fwd_ms = median_ms([&] { op.forward(a); }, iters, warmup);
  run.step_ms = median_ms(
      [&] {
        LinearAttentionResult r = op.forward(a);
        LinearAttentionBackwardArgs c = b;
        c.saved = std::move(r.saved);
        op.backward(a, c);
      },
      iters, warmup);
  return run;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> want;
  int iters = 20, warmup = 5;
  std::string json_path, dtype_name = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--shape") want.push_back(next());
    else if (a == "--dtype") dtype_name = next();
    else if (a == "--iters") iters = std::max(1, std::stoi(next()));
    else if (a == "--warmup") warmup = std::max(0, std::stoi(next()));
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "usage: gdn_bench [--shape NAME]... [--dtype bf16|fp16|fp32] [--iters N] [--warmup N] [--json FILE]\n");
      return 2;
    }
  }
  const at::ScalarType dt = parse_dtype(dtype_name);
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "gdn_bench: needs a CUDA device\n");
    return 1;
  }
  ax::Registry registry;
  ax::register_builtins(registry);
  auto aten = registry.kernel<LinearAttention>("aten");
  auto gdn = ax::gdn::make_linear_attention(ax::gdn::cuda_kernels());
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-20s %-6s %10s %10s %10s\n", "shape", "backend", "fwd_ms", "step_ms", "rel_err");
  for (const Shape& s : kShapes) {
    if (!want.empty() && std::find(want.begin(), want.end(), s.name) == want.end()) continue;
    at::manual_seed(0);
    const LinearAttentionArgs a = make_args(s, dt);
    LinearAttentionBackwardArgs b;
    b.grad_out = at::randn(a.v.sizes(), a.v.options());
    Run ref = measure(*aten, a, b, iters, warmup);
    Run run = measure(*gdn, a, b, iters, warmup);
    const double err = std::max({rel(run.r.out, ref.r.out), rel(run.g.dq, ref.g.dq), rel(run.g.dk, ref.g.dk),
                                 rel(run.g.dv, ref.g.dv), rel(run.g.dg, ref.g.dg), rel(run.g.dbeta, ref.g.dbeta)});
    std::printf("%-20s %-6s %10.3f %10.3f\n", s.name, "aten", ref.fwd_ms, ref.step_ms);
    std::printf("%-20s %-6s %10.3f %10.3f %10.2e\n", s.name, "gdn", run.fwd_ms, run.step_ms, err);
    std::fflush(stdout);
    rows.push_back({{"shape", s.name}, {"seqlens", s.seqlens}, {"Hk", s.Hk}, {"Hv", s.Hv}, {"Dk", s.Dk},
                    {"Dv", s.Dv}, {"dtype", dtype_name}, {"qk_l2norm", true},
                    {"aten_fwd_ms", ref.fwd_ms}, {"aten_step_ms", ref.step_ms},
                    {"gdn_fwd_ms", run.fwd_ms}, {"gdn_step_ms", run.step_ms},
                    {"gdn_speedup_vs_aten_step", ref.step_ms / run.step_ms},
                    {"rel_err_gdn_vs_aten", err}});
  }
  if (!json_path.empty()) {
    // Where, when and how, inside the file (docs/performance.md, "Citing results").
    std::string command = "gdn_bench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    nlohmann::json out = {{"bench", "gdn_bench: linear_attention, the gdn CUDA kernels vs core's aten backend"},
                          {"device", at::cuda::getCurrentDeviceProperties()->name},
                          {"date", ax::utc_date_today()},
                          {"command", command},
                          {"iters", iters},
                          {"rows", rows}};
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gdn_bench: %s\n", e.what());
  return 1;
}
