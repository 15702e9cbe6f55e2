// sonicmoe_bench: the moe.mlp block of sonicmoe vs scattermoe (its fallback; moe.experts composed) at the
// issue's shapes, T = 4096 tokens, LoRA r = 16 on both projections, bf16, ENK weights:
//   fwd_ms      forward alone (median of event-timed calls)
//   step_ms     forward + backward (dx, four LoRA grads, dgates)
//   saved_MB    the tensors the forward keeps for backward (distinct storages)
//   dense_ms    one cuBLAS GEMM of the forward's FLOPs ([M, H] x [H, 3I]): the "70% of cuBLAS" yardstick
//   rel_err     the largest norm-relative difference of y, dx, the LoRA grads and dgates vs scattermoe
// --profile prints, per shape and backend, the Kineto summary of 5 fwd+bwd calls (where the time goes).
// Usage: sonicmoe_bench [--shape NAME]... [--iters N] [--tokens T] [--json FILE] [--profile]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <axengine/bench_result.hpp>
#include <axengine/builtins.hpp>
#include <axengine/ops/moe_mlp.hpp>
#include <axengine/plugin_loader.hpp>
#include <axengine/profiler.hpp>
#include <axengine/registry.hpp>

namespace {

using namespace ax::ops;

struct Shape {
  const char* name;
  int64_t E, H, I, k;
  bool gpt_oss;
};
const Shape kShapes[] = {
    {"qwen3-30b-a3b", 128, 2048, 768, 8, false},
    {"olmoe", 64, 2048, 1024, 8, false},
    {"mixtral", 8, 4096, 14336, 2, false},
    {"gpt-oss-20b", 32, 2880, 2880, 4, true},
};

MoeMlpArgs make_args(const Shape& s, int64_t T, int64_t r) {
  auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  MoeMlpArgs a;
  a.x = at::randn({T, s.H}, o);
  const at::Tensor experts = std::get<1>(at::rand({T, s.E}, o.dtype(at::kFloat)).topk(s.k, 1)).reshape({-1});
  const auto sorted = experts.sort(/*stable=*/true, 0, false);
  a.routing.sorted_expert_idxs = std::get<0>(sorted);
  a.routing.sorted_scattered_idxs = std::get<1>(sorted);
  a.routing.expert_offsets = experts.bincount({}, s.E).cumsum(0);
  a.routing.top_k = s.k;
  a.gates = at::softmax(at::randn({T, s.k}, o.dtype(at::kFloat)), 1).to(at::kBFloat16);
  a.layout = ExpertLayout::ENK;
  a.gate_up = WeightTensor::dense(at::randn({s.E, 2 * s.I, s.H}, o) / std::sqrt(double(s.H)));
  a.down = WeightTensor::dense(at::randn({s.E, s.H, s.I}, o) / std::sqrt(double(s.I)));
  a.gate_up_lora = {at::randn({r * s.E, s.H}, o) / std::sqrt(double(s.H)), at::randn({2 * s.I, r * s.E}, o) * 0.1, 2.0};
  a.down_lora = {at::randn({r * s.E, s.I}, o) / std::sqrt(double(s.I)), at::randn({s.H, r * s.E}, o) * 0.1, 2.0};
  if (s.gpt_oss) {
    a.activation = MoeActivation::clamped_glu;
    a.packing = GluPacking::interleaved;
    a.gate_up_bias = at::randn({s.E, 2 * s.I}, o) * 0.1;
    a.down_bias = at::randn({s.E, s.H}, o) * 0.1;
  }
  a.check_values = false;
  return a;
}

double median_ms(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    at::cuda::CUDAEvent a(cudaEventDefault), b(cudaEventDefault);
    a.record();
    fn();
    b.record();
    b.synchronize();
    ms.push_back(a.elapsed_time(b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0 : 1e30;
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  if (!x.isfinite().all().item<bool>()) return 1e30;
  return (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30);
}

struct Run {
  double fwd_ms = 0, step_ms = 0, saved_mb = 0;
  MoeMlpResult r;
  MoeMlpGrads g;
};

Run measure(MoeMlp& be, const MoeMlpArgs& a, const at::Tensor& dy, int iters, bool profile) {
  Run run;
  auto step = [&] {
    MoeMlpResult r = be.forward(a);
    MoeMlpBackwardArgs b;
    b.grad_y = dy;
    b.saved = r.saved;
    return std::make_pair(r, be.backward(a, b));
  };
  std::tie(run.r, run.g) = step();
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : run.r.saved)
    if (t.defined() && t.is_cuda() && seen.insert(t.storage().data()).second) bytes += t.storage().nbytes();
  run.saved_mb = double(bytes) / (1024.0 * 1024.0);
  run.fwd_ms = median_ms([&] { be.forward(a); }, iters);
  run.step_ms = median_ms([&] { step(); }, iters);
  if (profile) {
    ax::Profiler prof;
    prof.start(/*cuda=*/true);
    for (int i = 0; i < 5; ++i) step();
    std::printf("%s\n", prof.stop("", 30).c_str());
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> want;
  int iters = 20;
  int64_t T = 4096, r = 16;
  std::string json_path;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--shape") want.push_back(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--tokens") T = std::stoll(next());
    else if (a == "--json") json_path = next();
    else if (a == "--profile") profile = true;
    else {
      std::fprintf(stderr, "usage: sonicmoe_bench [--shape NAME]... [--iters N] [--tokens T] [--json FILE] [--profile]\n");
      return 2;
    }
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "sonicmoe_bench: needs a CUDA device\n");
    return 1;
  }
  auto registry = std::make_unique<ax::Registry>();
  ax::register_builtins(*registry);
  nlohmann::json rows = nlohmann::json::array();
  {
    ax::PluginLoader loader(*registry);
    for (const char* n : {"sonicmoe", "scattermoe"}) {
      const ax::PluginReport& rep = loader.load_file(std::string(AXENGINE_PLUGIN_DIR) + "/axengine_" + n + ".so", "bench");
      if (rep.status != ax::PluginReport::Status::loaded) {
        std::fprintf(stderr, "sonicmoe_bench: %s: %s\n", n, rep.reason.c_str());
        return 1;
      }
    }
    auto sonic = registry->kernel<MoeMlp>("sonicmoe");
    auto scatter = registry->kernel<MoeMlp>("scattermoe");
    std::printf("%-14s %-10s %9s %9s %9s %9s %10s %9s\n", "shape", "backend", "fwd_ms", "step_ms", "saved_MB",
                "dense_ms", "fwd/dense", "rel_err");
    for (const Shape& s : kShapes) {
      if (!want.empty() && std::find(want.begin(), want.end(), s.name) == want.end()) continue;
      at::manual_seed(0);
      const MoeMlpArgs a = make_args(s, T, r);
      const at::Tensor dy = at::randn_like(a.x);
      const int64_t M = T * s.k;
      const at::Tensor da = at::randn({M, s.H}, a.x.options()), db = at::randn({s.H, 3 * s.I}, a.x.options());
      const double dense_ms = median_ms([&] { at::mm(da, db); }, iters);
      Run ref;
      for (auto* be : {scatter.get(), sonic.get()}) {
        const bool is_sonic = be == sonic.get();
        Run run;
        try {
          run = measure(*be, a, dy, iters, profile);
        } catch (const std::exception& e) {
          std::printf("%-14s %-10s failed: %s\n", s.name, is_sonic ? "sonicmoe" : "scattermoe", e.what());
          continue;
        }
        double err = 0;
        if (is_sonic && ref.r.y.defined()) {
          err = std::max({rel(run.r.y, ref.r.y), rel(run.g.dx, ref.g.dx), rel(run.g.dgates, ref.g.dgates),
                          rel(run.g.dgate_up_lora_a, ref.g.dgate_up_lora_a), rel(run.g.dgate_up_lora_b, ref.g.dgate_up_lora_b),
                          rel(run.g.ddown_lora_a, ref.g.ddown_lora_a), rel(run.g.ddown_lora_b, ref.g.ddown_lora_b)});
        }
        std::printf("%-14s %-10s %9.3f %9.3f %9.1f %9.3f %10.2f %9.2e\n", s.name, is_sonic ? "sonicmoe" : "scattermoe",
                    run.fwd_ms, run.step_ms, run.saved_mb, dense_ms, dense_ms / run.fwd_ms, err);
        std::fflush(stdout);
        rows.push_back({{"shape", s.name}, {"backend", is_sonic ? "sonicmoe" : "scattermoe"}, {"fwd_ms", run.fwd_ms},
                        {"step_ms", run.step_ms}, {"saved_mb", run.saved_mb}, {"dense_gemm_ms", dense_ms},
                        {"rel_err_vs_scattermoe", err}, {"tokens", T}, {"rank", r}});
        if (!is_sonic) ref = std::move(run);
      }
    }
    sonic.reset();
    scatter.reset();
    registry.reset();  // the plugins' objects go before the loader unloads them
  }
  if (!json_path.empty()) {
    // Where, when and how, inside the file (docs/performance.md, "Citing results").
    std::string command = "sonicmoe_bench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    nlohmann::json out = {{"bench", "sonicmoe_bench: the moe.mlp block, sonicmoe vs scattermoe"},
                          {"device", at::cuda::getCurrentDeviceProperties()->name},
                          {"date", ax::utc_date_today()},
                          {"command", command},
                          {"rows", rows}};
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}
