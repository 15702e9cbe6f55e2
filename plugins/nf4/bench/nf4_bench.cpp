// nf4_bench: the nf4 plugin's kernels on the current CUDA device. Prints one JSON object.
//
//   nf4_bench [--iters 20] [--warmup 5] [--skip-linear] [--skip-quantize]
//
// (a) dequant of [4096, 4096], [4096, 11008], [8192, 28672] to bf16, double quant off and on: GB/s (bytes
//     read + written: codes, scales, nested fields, output) and as a fraction of a device-to-device copy
//     of the output's size (read + written) timed in the same run; and core's reference ops::dequantize
//     (ATen) on the same weight, as a time ratio reference / ours.
// (b) the QLoRA linear fwd+bwd (dx, dA, dB) at Qwen3-8B shapes, T = 4096, r = 16, bf16, double quant:
//     ours (chunked) vs core's aten linear.lora (dequantise whole + cuBLAS + LoRA): ms, ratio, and the
//     peak memory each allocates above what was live before (caching allocator stats).
// (c) quantisation of a [8192, 28672] bf16 tensor, double quant off and on: ours vs ops::quantize_nf4, s.
// Times: CUDA events around each call on the current stream, median of --iters after --warmup.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <axengine/bench_result.hpp>
#include <axengine/cuda/bench_timer.hpp>
#include <axengine/builtins.hpp>
#include <axengine/ops/linear_lora.hpp>
#include <axengine/ops/quant.hpp>
#include <axengine/registry.hpp>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../src/nf4.hpp"

namespace {

using nlohmann::json;

struct Timing {
  int iters = 20, warmup = 5;
};

double median_ms(const Timing& t, const std::function<void()>& f) { return ax::cuda::median_event_ms(f, t.iters, t.warmup); }

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

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

json bench_dequant(const Timing& t) {
  json rows = json::array();
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {4096, 11008}, {8192, 28672}}) {
    const at::Tensor v = at::randn({N, K}, bf);
    for (bool dq : {false, true}) {
      const ax::ops::WeightTensor w = ax::nf4::quantize(v, 64, dq);
      const at::Tensor out = at::empty({N, K}, bf), copy = at::empty({N, K}, bf);
      const double ours = median_ms(t, [&] { ax::nf4::dequantize_range(w, 0, out); });
      const double cp = median_ms(t, [&] { copy.copy_(out); });
      const double ref = median_ms(t, [&] { (void)ax::ops::dequantize(w, at::kBFloat16); });
      const int64_t moved = bytes_of(w.codes) + bytes_of(w.scales) + bytes_of(w.nested_scales) +
                            bytes_of(w.nested_code) + bytes_of(out);
      const double gbps = static_cast<double>(moved) / (ours * 1e6);
      const double copy_gbps = 2.0 * static_cast<double>(bytes_of(out)) / (cp * 1e6);
      json j;
      j["shape"] = {N, K};
      j["double_quant"] = dq;
      j["ms"] = ours;
      j["gb_per_s"] = gbps;
      j["copy_ms"] = cp;
      j["copy_gb_per_s"] = copy_gbps;
      j["fraction_of_copy"] = gbps / copy_gbps;
      j["reference_ms"] = ref;
      j["speedup_vs_reference"] = ref / ours;
      rows.push_back(j);
    }
  }
  return rows;
}

json bench_linear(const Timing& t, ax::ops::LinearLora& aten) {
  json rows = json::array();
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const int64_t T = 4096, r = 16;
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  for (const Shape& s : {Shape{"q/k/v/o", 4096, 4096}, Shape{"gate/up", 12288, 4096}, Shape{"down", 4096, 12288}}) {
    ax::ops::LinearLoraArgs a;
    a.weight = ax::nf4::quantize(at::randn({s.N, s.K}, bf) / 64.0, 64, true);
    a.x = at::randn({T, s.K}, bf);
    a.lora_a = at::randn({r, s.K}, bf) / 64.0;
    a.lora_b = at::randn({s.N, r}, bf) / 64.0;
    a.scaling = 2.0;
    ax::ops::LinearLoraBackwardArgs b;
    b.grad_y = at::randn({T, s.N}, bf);
    auto ours = [&] {
      (void)ax::nf4::linear_forward(a);
      (void)ax::nf4::linear_backward(a, b);
    };
    auto ref = [&] {
      (void)aten.forward(a);
      (void)aten.backward(a, b);
    };
    json j;
    j["shape"] = {s.N, s.K};
    j["name"] = s.name;
    j["T"] = T;
    j["r"] = r;
    j["ms"] = median_ms(t, ours);
    j["reference_ms"] = median_ms(t, ref);
    j["speedup_vs_reference"] = j["reference_ms"].get<double>() / j["ms"].get<double>();
    // Outputs (y, dx, dA, dB) count in both peaks; the reference adds the whole [N, K] bf16 weight.
    j["peak_extra_bytes"] = peak_extra_bytes(ours);
    j["reference_peak_extra_bytes"] = peak_extra_bytes(ref);
    j["dense_weight_bytes"] = s.N * s.K * 2;
    rows.push_back(j);
  }
  return rows;
}

json bench_quantize(const Timing& t) {
  json rows = json::array();
  const at::Tensor v = at::randn({8192, 28672}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
  Timing few{std::max(1, t.iters / 4), 1};
  for (bool dq : {false, true}) {
    json j;
    j["shape"] = {8192, 28672};
    j["double_quant"] = dq;
    j["seconds"] = median_ms(few, [&] { (void)ax::nf4::quantize(v, 64, dq); }) / 1e3;
    j["reference_seconds"] = median_ms(few, [&] { (void)ax::ops::quantize_nf4(v, 64, dq); }) / 1e3;
    j["speedup_vs_reference"] = j["reference_seconds"].get<double>() / j["seconds"].get<double>();
    rows.push_back(j);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) try {
  Timing t;
  bool linear = true, quantize = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc)
      t.iters = std::max(1, std::stoi(argv[++i]));
    else if (arg == "--warmup" && i + 1 < argc)
      t.warmup = std::max(0, std::stoi(argv[++i]));
    else if (arg == "--skip-linear")
      linear = false;
    else if (arg == "--skip-quantize")
      quantize = false;
    else {
      std::cerr << "usage: nf4_bench [--iters 20] [--warmup 5] [--skip-linear] [--skip-quantize]\n";
      return 2;
    }
  }
  if (!at::hasCUDA()) {
    std::cerr << "nf4_bench: needs a CUDA device\n";
    return 1;
  }
  ax::Registry registry;
  ax::register_builtins(registry);
  const auto aten = registry.kernel<ax::ops::LinearLora>("aten");
  if (!aten) throw std::runtime_error("core's aten linear.lora backend is not registered");
  json out;
  out["device"] = at::cuda::getCurrentDeviceProperties()->name;
  out["date"] = ax::utc_date_today();  // where and when, inside the file (docs/performance.md, "Citing results")
  out["iters"] = t.iters;
  out["dequant"] = bench_dequant(t);
  if (linear) out["linear_lora"] = bench_linear(t, *aten);
  if (quantize) out["quantize"] = bench_quantize(t);
  std::cout << out.dump(2) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "nf4_bench: " << e.what() << "\n";
  return 1;
}
