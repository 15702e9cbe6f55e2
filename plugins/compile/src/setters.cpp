#include "setters.hpp"

#include <cstdlib>
#include <filesystem>

#include <ATen/Context.h>

#include <axengine/strings.hpp>
#include <axengine/tuning.hpp>

#include "tunable.hpp"

namespace ax::compile {

namespace {

bool b(const Value& v) { return std::get<bool>(v); }
int64_t i(const Value& v) { return std::get<int64_t>(v); }

void set_enabled(Runtime&, const Value&) {}  // decided before apply: a disabled table builds no runtime

void set_cuda_graphs(Runtime& r, const Value& v) { r.executor.cuda_graphs = b(v); }
void set_warmup_steps(Runtime& r, const Value& v) { r.executor.warmup_steps = i(v); }
void set_max_graphs(Runtime& r, const Value& v) { r.executor.max_graphs = i(v); }
void set_static_shapes(Runtime& r, const Value& v) { r.executor.static_shapes = b(v); }

void set_cache_dir(Runtime& r, const Value& v) {
  r.cache_dir = std::get<std::string>(v).empty() ? default_cache_dir() : std::get<std::string>(v);
}

void set_autotune_gemm(Runtime& r, const Value& v) {
  std::string what = set_gemm_tuning(b(v), r.device, r.cache_dir);
  if (!what.empty()) r.notes.push_back(what);
}

void set_autotune_kernels(Runtime& r, const Value& v) {
  request_kernel_tuning(b(v));
  if (b(v)) r.notes.push_back("autotune_kernels: plugin kernels time their tile choices on first use");
}

// TF32 for fp32 matmuls (cuBLAS) and convolutions (cuDNN). Flags only: harmless without a GPU.
void set_tf32(Runtime& r, const Value& v) {
  at::globalContext().setAllowTF32CuBLAS(b(v));
  at::globalContext().setAllowTF32CuDNN(b(v));
  if (b(v)) r.notes.push_back("tf32: fp32 matmuls and convolutions on TF32 tensor cores");
}

void set_cudnn_benchmark(Runtime& r, const Value& v) {
  at::globalContext().setBenchmarkCuDNN(b(v));
  if (b(v)) r.notes.push_back("cudnn_benchmark: cuDNN times its algorithms per shape");
}

// cuBLAS is deterministic only with a fixed workspace configuration, read when its handle is made: set here,
// before the first step; a value the user exported wins.
// ATen's deterministic mode also fills every new uninitialised tensor (at::empty) with NaN by default, so
// that a kernel reading memory it never wrote reads the same garbage each run: on the bench MoE step that
// was ~720 extra fill kernels per step, part of the mode's 1.49x cost (profile, docs/plugins/compile.md). Our
// ops write every element they return (conformance checks outputs whole), so the fill is turned off: the
// results stay bitwise repeatable (the GPU test of two deterministic graphed runs).
void set_deterministic(Runtime& r, const Value& v) {
  at::globalContext().setDeterministicAlgorithms(b(v), /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(b(v));
  if (b(v)) at::globalContext().setDeterministicFillUninitializedMemory(false);
  if (!b(v)) return;
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  r.notes.push_back(ax::str("deterministic: deterministic algorithms only (CUBLAS_WORKSPACE_CONFIG=",
                            std::getenv("CUBLAS_WORKSPACE_CONFIG"), ")"));
}

}  // namespace

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> s{
      {"enabled", set_enabled},
      {"cuda_graphs", set_cuda_graphs},
      {"warmup_steps", set_warmup_steps},
      {"max_graphs", set_max_graphs},
      {"static_shapes", set_static_shapes},
      {"autotune_gemm", set_autotune_gemm},
      {"autotune_kernels", set_autotune_kernels},
      {"cache_dir", set_cache_dir},
      {"tf32", set_tf32},
      {"cudnn_benchmark", set_cudnn_benchmark},
      {"deterministic", set_deterministic},
  };
  return s;
}

std::string sentinel_mismatch() {
  std::vector<std::string> problems;
  std::map<std::string, int> keys;
  for (const AllowedKey& k : allow_list()) {
    if (++keys[k.key] > 1) problems.push_back(ax::str("key '", k.key, "' is listed twice"));
    if (!setters().count(k.key)) problems.push_back(ax::str("key '", k.key, "' has no setter"));
  }
  for (const auto& [name, fn] : setters()) {
    if (!keys.count(name)) problems.push_back(ax::str("setter '", name, "' has no key"));
    if (!fn) problems.push_back(ax::str("setter '", name, "' is null"));
  }
  return ax::join(problems, "; ");
}

void apply_settings(Runtime& r, const std::map<std::string, Value>& values) {
  setters().at("cache_dir")(r, values.at("cache_dir"));
  for (const AllowedKey& k : allow_list())
    if (std::string(k.key) != "cache_dir") setters().at(k.key)(r, values.at(k.key));
}

std::string default_cache_dir() {
  namespace fs = std::filesystem;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "axengine").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "axengine").string();
  return (fs::temp_directory_path() / "axengine").string();
}

}  // namespace ax::compile
