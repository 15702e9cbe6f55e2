// The MoE expert-block benchmark shared by `axengine bench moe` (cmd_bench.cpp) and the standalone
// bench/moe_bench: the block (gate_up -> SiLU·up, or gpt-oss's clamped GLU with biases -> down with gates,
// LoRA on both projections), forward + backward, through moe.experts backends (two calls), moe.mlp backends
// (one call) and through the same block written with at::_grouped_mm
// (gather, grouped GEMMs for base and LoRA, index_add; autograd for the backward).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "axengine/registry.hpp"

namespace ax::bench {

struct MoeBenchOptions {
  std::vector<std::string> shapes;    // empty: all
  // "grouped_mm", moe.experts backend names, or "mlp:<name>" for the block as one moe.mlp call of backend
  // <name>; empty: grouped_mm, scattermoe, mlp:sonicmoe, mlp:scattermoe, reference (missing ones are skipped).
  std::vector<std::string> backends;
  int64_t tokens = 4096;
  int64_t rank = 16;
  int iters = 20;
  bool profile = false;  // after timing, profile 3 more iterations and print the GPU kernel summary
  // Expert weight format of the moe.experts backends: dense (bf16), nf4, mxfp4 or nvfp4 (quantised with
  // ops::quantize_*, blocks along K). The _grouped_mm block stays bf16: it dequantises every expert once
  // per call (timed), as a dequantise-then-GEMM implementation would.
  std::string format = "dense";
  // "cuda" (device 0, bf16, event timing) or "cpu" (fp32, wall clock: a smoke run of the code paths, e.g.
  // --shape tiny --shape tiny-gpt-oss).
  std::string device = "cuda";
};

// The shape names it knows: qwen3-30b-a3b, qwen3.5-35b-a3b, olmoe, mixtral, gpt-oss-20b (biases, clamped GLU),
// deepseek-v3, glm4.5-air (the group-limited sigmoid router's choice and gates), and the smoke shapes tiny,
// tiny-gpt-oss, tiny-deepseek (run only when named).
std::vector<std::string> moe_bench_shapes();

// Runs the comparison on CUDA device 0, printing a table to stdout as it goes, and returns the rows
// {shape, backend, ms (rested), ms_sustained (back to back), tflops, pct_of_floor, peak_extra_mb,
// first_call_s, speedup_vs_grouped_mm, speedup_sustained_vs_grouped_mm, ...}; see time_block.
// Throws UsageError for an unknown shape or when there is no CUDA device.
nlohmann::json run_moe_bench(const Registry& registry, const MoeBenchOptions& options);

}  // namespace ax::bench
