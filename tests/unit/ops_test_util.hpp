// Helpers for the kernel-op tests: a small safetensors reader (goldens), norm-relative error, routing
// builders for moe.experts and the autograd entry point.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include "axengine/builtins.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/registry.hpp"

namespace ax::test {

inline std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> out;
  const nlohmann::json j = nlohmann::json::parse(header);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string name = it.key();
    const nlohmann::json& info = it.value();
    if (name == "__metadata__") continue;
    const std::string dt = info["dtype"];
    at::ScalarType st = dt == "F32" ? at::kFloat : dt == "BF16" ? at::kBFloat16 : dt == "F16" ? at::kHalf
                      : dt == "U8" ? at::kByte : dt == "I64" ? at::kLong : dt == "F64" ? at::kDouble
                      : throw std::runtime_error("unsupported dtype " + dt);
    std::vector<int64_t> shape = info["shape"].get<std::vector<int64_t>>();
    const size_t b = info["data_offsets"][0], e = info["data_offsets"][1];
    at::Tensor t = at::empty(shape, at::kCPU).to(st);
    if (static_cast<size_t>(t.nbytes()) != e - b) throw std::runtime_error("bad size for " + name);
    std::memcpy(t.data_ptr(), data.data() + b, e - b);
    out[name] = t;
  }
  return out;
}

// tests/data/<rel>; AXENGINE_TEST_DATA_DIR in the environment overrides the build-time path (running a
// copied test binary on another machine).
// Core's built-in backends (reference, aten), registered once per test binary.
inline const Registry& builtin_registry() {
  static const Registry reg = [] {
    Registry r;
    register_builtins(r);
    return r;
  }();
  return reg;
}

// The built-in backend `name` of op `Op`; throws (failing the test case) when it is not registered.
template <class Op>
std::shared_ptr<Op> builtin_backend(const std::string& name) {
  auto p = builtin_registry().kernel<Op>(name);
  if (!p) throw std::runtime_error(std::string("no built-in backend '") + name + "' of " + Op::kOp);
  return p;
}

inline std::string data_path(const std::string& rel) {
  const char* env = std::getenv("AXENGINE_TEST_DATA_DIR");
  return std::string(env && *env ? env : AXENGINE_TEST_DATA_DIR) + "/" + rel;
}

// ||a - b|| / ||b|| in fp64 (0 when both are zero).
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  const double den = y.norm().item<double>(), num = (x - y).norm().item<double>();
  return den == 0 ? num : num / den;
}

inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b);
}

// Top-k routing for T tokens over E experts as ScatterMoE builds it: pick k distinct experts per token
// at random, sort the flattened choices (stable, by expert), offsets = cumulative counts.
// `inactive` entries (chosen at random among all, fraction p) are set to -1 in place after sorting:
// they stay inside their expert's range, as when another rank owns the expert.
inline ops::MoeRouting make_routing(int64_t T, int64_t E, int64_t k, uint64_t seed, double inactive = 0.0,
                                    bool inactive_last = false, at::Tensor skip_experts = {}) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor logits = at::rand({T, E}, gen);
  if (skip_experts.defined()) logits.index_fill_(1, skip_experts, -1.0);  // these experts get no tokens if k allows
  at::Tensor experts = std::get<1>(logits.topk(k, 1)).reshape(-1);          // [T·k], entry s = t·k + j
  // inactive_last: inactive entries carry E while sorting so they land after every expert's range;
  // otherwise they are marked after sorting and stay inside their expert's range.
  at::Tensor drop = inactive > 0 ? at::rand({T * k}, gen) < inactive : at::zeros({T * k}, at::kBool);
  if (inactive_last) experts = at::where(drop, at::full({}, E, at::kLong), experts);
  auto [sorted, order] = at::sort(experts, /*stable=*/true, 0, false);
  at::Tensor counts = at::zeros({E + 1}, at::kLong).index_add_(0, sorted, at::ones_like(sorted)).slice(0, 0, E);
  if (!inactive_last) sorted = at::where(drop.index_select(0, order), at::full({}, -1, at::kLong), sorted);
  ops::MoeRouting r;
  r.top_k = k;
  r.sorted_scattered_idxs = order;
  r.sorted_expert_idxs = at::where(sorted >= E, at::full({}, -1, at::kLong), sorted);
  r.expert_offsets = counts.cumsum(0);
  return r;
}

}  // namespace ax::test
