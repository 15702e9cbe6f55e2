#include "allow_list.hpp"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

namespace ax::compile {

namespace {
// Where each key was measured to help or hurt (bench/compile/knobs.sh; the table and its files are in
// docs/plugins/compile.md). Step-time ratios to eager, each knob alone, 2 seeds, fresh processes.
std::string measured(const std::string& key) {
  static const std::map<std::string, std::string> m = {
      {"cuda_graphs", "H200, bench MoE model (0.9B, 1,518 launches/step): 0.988x with static_shapes; Qwen3-8B-shaped dense step: 1.046x"},
      {"static_shapes", "H200, bench MoE model: 1.036x with cudnn_benchmark (the padding without graphs); the padding is what graphs pay for"},
      {"autotune_gemm", "H200: 0.997x on the bench MoE model, 1.001x on the dense Qwen3-8B shape (cuBLAS heuristics already pick well)"},
      {"autotune_kernels", "H200, bench MoE model: 1.008x (scattermoe's default tiles already fit)"},
      {"tf32", "H200: 1.007x on the bench MoE model and on the dense Qwen3-8B shape (their fp32 math is small)"},
      {"cudnn_benchmark", "H200, bench MoE model: 1.036x with static_shapes (no ATen cuDNN call benefits there)"},
      {"deterministic", "H200, bench MoE model: 1.073x slower"},
  };
  auto it = m.find(key);
  return it == m.end() ? std::string() : "Measured: " + it->second + " (docs/plugins/compile.md).";
}

std::string with_measure(const char* key, const char* doc) {
  std::string d = doc, m = measured(key);
  if (m.empty()) return d;
  return d + (d.back() == '.' ? " " : ". ") + m;
}
}  // namespace

const std::vector<AllowedKey>& allow_list() {
  static const std::vector<AllowedKey> keys = [] {
    std::vector<AllowedKey> k;
    k.push_back({"enabled", KeyType::boolean, false, 0, 0, false,
                 "turn the compile options on; false (the default) runs exactly as without the plugin, and any "
                 "other key set then is an error"});
    k.push_back({"cuda_graphs", KeyType::boolean, false, 0, 0, true,
                 "capture the whole training step (forward, backward, clipping, optimizer) in a CUDA graph after "
                 "warmup_steps eager steps and replay it, new batches copied into its static inputs; one graph per "
                 "shape signature up to max_graphs. Falls back to eager steps, saying why once, when a selected "
                 "kernel backend is not declared graph_safe, the step syncs with the host, the optimizer cannot "
                 "take a device learning rate, or the run is not on CUDA. With packed rows, set static_shapes too."});
    k.push_back({"warmup_steps", KeyType::integer, int64_t{3}, 1, 1000, true,
                 "eager steps per shape signature before it is captured (lazy initialisation, autotuning and "
                 "allocator growth must happen outside the capture)"});
    k.push_back({"max_graphs", KeyType::integer, int64_t{4}, 1, 64, true,
                 "the most graphs kept (one per shape signature); a step of a new signature beyond it runs eagerly "
                 "(each graph holds its own activation memory)"});
    k.push_back({"static_shapes", KeyType::boolean, false, 0, 0, true,
                 "pad every micro-batch to one shape: cu_seqlens to the run's span capacity with empty spans, "
                 "max_seqlen to the row length; losses are identical (empty spans carry no tokens), and packed runs "
                 "then replay a single graph"});
    k.push_back({"autotune_gemm", KeyType::boolean, false, 0, 0, true,
                 "tune the cuBLAS/cuBLASLt GEMMs per shape on first use with LibTorch's TunableOp "
                 "(at::cuda::tunable); results go to a file per GPU model in cache_dir and are reused by later runs"});
    k.push_back({"autotune_kernels", KeyType::boolean, false, 0, 0, true,
                 "let the plugins' own kernels time their tile choices on first use and cache them (scattermoe's "
                 "tuner, as [kernels.options.scattermoe] tune = true does)"});
    k.push_back({"cache_dir", KeyType::string, std::string(), 0, 0, false,
                 "directory of the tuning caches (relative: to the config file); \"\" = $XDG_CACHE_HOME/axengine, "
                 "else ~/.cache/axengine"});
    k.push_back({"tf32", KeyType::boolean, false, 0, 0, true,
                 "fp32 matmuls and convolutions on TF32 tensor cores (cuBLAS and cuDNN); only fp32 math is "
                 "affected (LoRA factors in fp32), with a 10-bit mantissa"});
    k.push_back({"cudnn_benchmark", KeyType::boolean, false, 0, 0, true,
                 "let cuDNN time its algorithms per shape on first use (vision towers' convolutions); costs a "
                 "search per new shape, so pair it with static_shapes"});
    k.push_back({"deterministic", KeyType::boolean, false, 0, 0, true,
                 "deterministic algorithms only (at::Context::setDeterministicAlgorithms, deterministic cuDNN, "
                 "CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset): bitwise-repeatable runs, at the cost of slower or "
                 "refused (error) nondeterministic kernels; excludes cudnn_benchmark"});
    static std::deque<std::string> docs;  // AllowedKey holds char pointers: the strings live here (stable)
    for (auto& key : k)
      if (std::string(key.key) != "enabled" && std::string(key.key) != "cache_dir") {
        docs.push_back(with_measure(key.key, key.doc));
        key.doc = docs.back().c_str();
      }
    return k;
  }();
  return keys;
}

bool CompileOptions::enabled() const {
  auto it = values.find("enabled");
  return it != values.end() && std::get<bool>(it->second);
}

std::map<std::string, Value> CompileOptions::resolve(int arch) const {
  std::map<std::string, Value> v = values;
  if (auto it = by_arch.find(arch); arch > 0 && it != by_arch.end())
    for (const auto& [k, x] : it->second) v[k] = x;
  return v;
}

namespace {

// Binds the keys of `keys` from `t` into `out`: typed through TableBinder, so its errors and docs are the
// config binder's own. `only_given`: record only keys present in the table (arch overrides).
void bind_keys(TableBinder& t, std::map<std::string, Value>& out, bool only_given, bool arch_table) {
  for (const AllowedKey& k : allow_list()) {
    if (arch_table && !k.per_arch) continue;
    const bool given = t.table() && t.table()->get(k.key);
    switch (k.type) {
      case KeyType::boolean: {
        bool v = std::get<bool>(k.deflt);
        t.field(k.key, v, k.doc);
        if (given || !only_given) out[k.key] = v;
        break;
      }
      case KeyType::integer: {
        int64_t v = std::get<int64_t>(k.deflt);
        t.bounded(k.key, v, k.lo, k.hi, k.doc);
        if (given || !only_given) out[k.key] = v;
        break;
      }
      case KeyType::string: {
        std::string v = std::get<std::string>(k.deflt);
        t.field(k.key, v, k.doc);
        if (given || !only_given) out[k.key] = v;
        break;
      }
    }
  }
}

bool flag(const std::map<std::string, Value>& v, const char* key) {
  auto it = v.find(key);
  return it != v.end() && std::holds_alternative<bool>(it->second) && std::get<bool>(it->second);
}

// Unknown keys of [compile] or an arch table: the binder's location and "did you mean", plus the allowed list
// (the allow-list is short and the point of it).
void refuse_unknown(const TableBinder& t, bool arch_table) {
  if (!t.table()) return;
  std::vector<std::string> allowed;
  for (const AllowedKey& k : allow_list())
    if (!arch_table || k.per_arch) allowed.emplace_back(k.key);
  if (!arch_table) allowed.emplace_back("arch");
  for (const auto& [name, node] : *t.table()) {
    const std::string key(name.str());
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string msg = ax::str("unknown key '", t.path(), ".", key, "'");
    if (std::string hint = ax::closest(key, allowed); !hint.empty()) msg += ax::str(" (did you mean '", hint, "'?)");
    msg += ax::str("; allowed: ", ax::join(allowed, ", "));
    if (arch_table) msg += " (enabled and cache_dir only in [compile])";
    if (name.source().begin)
      throw ConfigError(name.source().path ? std::string(*name.source().path) : t.context().file,
                        static_cast<int>(name.source().begin.line), static_cast<int>(name.source().begin.column), msg);
    t.fail(&node, msg);
  }
}

}  // namespace

std::string conflicts(const std::map<std::string, Value>& v) {
  if (flag(v, "deterministic") && flag(v, "cudnn_benchmark"))
    return "deterministic = true and cudnn_benchmark = true contradict each other (a timed algorithm choice is "
           "not repeatable); keep one";
  if (flag(v, "static_shapes") && !flag(v, "cuda_graphs") && !flag(v, "cudnn_benchmark"))
    return "static_shapes = true pads batches for cuda_graphs (or cudnn_benchmark) only; set one of them or drop it";
  return "";
}

void bind_compile(TableBinder& t, CompileOptions& o) {
  refuse_unknown(t, false);
  bind_keys(t, o.values, /*only_given=*/false, /*arch_table=*/false);
  if (const toml::table* tbl = t.table())
    for (const auto& [k, node] : *tbl) o.given.emplace_back(k.str());
  if (!t.context().file.empty()) o.config_dir = std::filesystem::path(t.context().file).parent_path().string();

  // [compile.arch.sm_XX]: the per-arch keys, as [kernels.arch] does for backends.
  TableBinder arch = t.sub("arch", "per-GPU overrides: [compile.arch.sm_90] takes every key but enabled and cache_dir");
  if (const toml::table* at = arch.table()) {
    for (const auto& [name, node] : *at) {
      const std::string n(name.str());
      arch.accept(n);
      int sm = 0;
      const bool ok = n.size() > 3 && n.rfind("sm_", 0) == 0 &&
                      std::all_of(n.begin() + 3, n.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (ok) sm = std::atoi(n.c_str() + 3);
      // Canonical names only: sm_090 and sm_90 would be one GPU twice.
      if (!ok || sm <= 0 || n != ax::str("sm_", sm))
        arch.fail(&node, ax::str("compile.arch.", n, ": expected an arch table named sm_<digits>, e.g. sm_90"));
      if (!node.is_table()) arch.fail(&node, ax::str("compile.arch.", n, " must be a table"));
      TableBinder one(node.as_table(), "compile.arch." + n, t.context());
      refuse_unknown(one, true);
      bind_keys(one, o.by_arch[sm], /*only_given=*/true, /*arch_table=*/true);
      one.finish();
    }
  } else if (t.context().docs) {
    TableBinder one(nullptr, "compile.arch.sm_XX", t.context());
    std::map<std::string, Value> ignored;
    bind_keys(one, ignored, true, true);
  }
  arch.finish();

  if (!o.enabled()) {
    for (const auto& k : o.given)
      if (k != "enabled")
        t.fail(t.table()->get(k), ax::str("compile.", k, " is set while compile.enabled = false; set enabled = true, or remove it"));
  }
  if (std::string c = conflicts(o.values); !c.empty()) t.fail(t.table() ? t.table()->get("enabled") : nullptr, "compile: " + c);
  for (const auto& [sm, over] : o.by_arch)
    if (std::string c = conflicts(o.resolve(sm)); !c.empty())
      arch.fail(arch.table()->get(ax::str("sm_", sm)), ax::str("compile.arch.sm_", sm, ": ", c));
  // A relative cache_dir follows the config file, as every path of a run config does.
  auto& dir = std::get<std::string>(o.values["cache_dir"]);
  if (!dir.empty() && std::filesystem::path(dir).is_relative() && !o.config_dir.empty())
    dir = (std::filesystem::path(o.config_dir) / dir).lexically_normal().string();
}

}  // namespace ax::compile
