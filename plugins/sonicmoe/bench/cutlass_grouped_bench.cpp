// cutlass_grouped_bench: issue 42's first measurement. The store GEMM of sonicmoe (rows sorted by expert,
// D_m = A_m · W_e(m)ᵀ with W_e [N, K]) on CUTLASS's sm90 ptr-array collectives, each schedule of
// ../cutlass/grouped_gemm.hpp (ping-pong 128x128, cooperative 128x256 on 2-CTA clusters), against, in the same run
// and on the same tensors:
//   grouped_mm   at::_grouped_mm (PyTorch's CUTLASS-based grouped GEMM, what scattermoe's fallback calls)
//   dense        one cuBLAS GEMM of the same FLOPs ([M, K] x [K, N]): the "% of cuBLAS" yardstick
// Shapes: the bench moe shapes' down (K = I, N = H) and up (K = H, N = 2I) projections at T = 4096 tokens,
// routing random top-k. Prints, per schedule, ms (median of event-timed calls, axengine/cuda/bench_timer.hpp), the
// ratio to dense and to grouped_mm, and the largest difference to grouped_mm relative to its largest value.
// Usage: cutlass_grouped_bench [--iters N] [--tokens T] [--json FILE]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <axengine/bench_result.hpp>
#include <axengine/cuda/bench_timer.hpp>

#include "../cutlass/grouped_gemm.hpp"

namespace {

namespace cg = ax::sonicmoe::cutlass_gemm;

struct Shape {
  const char* name;
  int64_t E, H, I, k;
};
const Shape kShapes[] = {
    {"qwen3-30b-a3b", 128, 2048, 768, 8},
    {"qwen3.5-35b-a3b", 256, 2048, 512, 8},
    {"olmoe", 64, 2048, 1024, 8},
    {"mixtral", 8, 4096, 14336, 2},
    {"deepseek-v3", 256, 7168, 2048, 8},
};


}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  int64_t T = 4096;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: cutlass_grouped_bench [--iters N] [--tokens T] [--json FILE]\n");
      return 2;
    }
  }
  if (!at::cuda::is_available()) {
    std::fprintf(stderr, "cutlass_grouped_bench: no CUDA device\n");
    return 2;
  }
  const auto prop = at::cuda::getCurrentDeviceProperties();
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-16s %-5s %-20s %7s %6s %6s %10s %10s %10s %9s %9s %9s\n", "shape", "gemm", "schedule", "M", "K", "N",
              "cutlass_ms", "grouped_ms", "dense_ms", "cut/dense", "grp/cut", "rel_err");
  for (const Shape& s : kShapes) {
    const int64_t M = T * s.k;
    const at::Tensor experts = std::get<1>(at::rand({T, s.E}, o.dtype(at::kFloat)).topk(s.k, 1)).reshape({-1});
    const at::Tensor counts = experts.bincount({}, s.E);
    const at::Tensor ends = counts.cumsum(0);
    const at::Tensor seg = at::cat({at::zeros({1}, ends.options()), ends}).to(at::kLong);
    const at::Tensor offs = ends.to(at::kInt);
    for (const bool down : {true, false}) {
      const int64_t K = down ? s.I : s.H, N = down ? s.H : 2 * s.I;
      const at::Tensor a = at::randn({M, K}, o);
      const at::Tensor w = at::randn({s.E, N, K}, o) / std::sqrt(double(K));
      const at::Tensor wt = w.transpose(1, 2);  // [E, K, N] view: _grouped_mm's B
      const at::Tensor ref = at::_grouped_mm(a, wt, offs);
      const at::Tensor da = at::randn({M, K}, o), db = at::randn({K, N}, o);
      const double grp_ms = ax::cuda::median_event_ms([&] { at::_grouped_mm(a, wt, offs); }, iters, 3);
      const double dense_ms = ax::cuda::median_event_ms([&] { at::mm(da, db); }, iters, 3);
      at::Tensor scratch = at::empty({int64_t(cg::grouped_gemm_scratch_bytes(int(s.E), 0))}, o.dtype(at::kByte));
      for (const cg::Schedule sched : {cg::Schedule::pingpong_128x128, cg::Schedule::cooperative_128x256}) {
        at::Tensor d = at::empty({M, N}, o);
        cg::GroupedGemmArgs g;
        g.E = int(s.E);
        g.seg = seg.data_ptr<int64_t>();
        g.N = int(N);
        g.K = int(K);
        g.a = a.data_ptr();
        g.lda = K;
        g.w = w.data_ptr();
        g.ldw = K;
        g.d = d.data_ptr();
        g.ldd = N;
        g.scratch = scratch.data_ptr();
        g.schedule = sched;
        const char* why = nullptr;
        auto cut = [&] { why = cg::launch_grouped_gemm(g, stream); };
        cut();
        if (why) {
          std::fprintf(stderr, "%s %s: %s\n", s.name, cg::schedule_name(sched), why);
          return 1;
        }
        const double err = ((d.to(at::kFloat) - ref.to(at::kFloat)).abs().max() / ref.to(at::kFloat).abs().max()).item<double>();
        const double cut_ms = ax::cuda::median_event_ms(cut, iters, 3);
        std::printf("%-16s %-5s %-20s %7lld %6lld %6lld %10.4f %10.4f %10.4f %9.3f %9.3f %9.2e\n", s.name,
                    down ? "down" : "up", cg::schedule_name(sched), (long long)M, (long long)K, (long long)N, cut_ms, grp_ms,
                    dense_ms, dense_ms / cut_ms, grp_ms / cut_ms, err);
        const double tflop = 2.0 * M * K * N / 1e12;
        rows.push_back({{"shape", s.name}, {"gemm", down ? "down" : "up"}, {"schedule", cg::schedule_name(sched)},
                        {"E", s.E}, {"M", M}, {"K", K}, {"N", N}, {"cutlass_ms", cut_ms}, {"grouped_mm_ms", grp_ms},
                        {"dense_ms", dense_ms}, {"cutlass_tflops", tflop / (cut_ms / 1e3)},
                        {"cutlass_vs_dense", dense_ms / cut_ms}, {"grouped_mm_vs_dense", dense_ms / grp_ms},
                        {"speedup_vs_grouped_mm", grp_ms / cut_ms}, {"rel_err", err}});
      }
    }
  }
  if (!json_path.empty()) {
    std::string cmd = "cutlass_grouped_bench";
    for (int i = 1; i < argc; ++i) cmd += std::string(" ") + argv[i];
    nlohmann::json out = {{"device", prop->name}, {"date", ax::utc_date_today()}, {"command", cmd},
                          {"tokens", T}, {"iters", iters}, {"rows", rows}};
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}
