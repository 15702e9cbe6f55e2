#include "train/memory_estimate.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "axengine/strings.hpp"
#include "device_probe.hpp"

namespace ax::train {
namespace {

// A positive integer of `c` (the sizes may be huge or absurd: they are read as doubles, so nothing overflows).
double size_of(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->is_number() && it->get<double>() > 0 ? it->get<double>() : 0.0;
}

// A "<key> <kB> kB" line of /proc/meminfo or /proc/self/status, in bytes; 0 when absent.
double proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream ss(line.substr(key.size() + 1));
      double kb = 0;
      ss >> kb;
      return kb * 1024.0;
    }
  return 0;
}

// The cgroup v2 limit of this process less its usage; 0 when unlimited or unknown.
double cgroup_room() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty()) return 0;
  auto read = [&](const std::string& name) {
    std::ifstream in("/sys/fs/cgroup" + path + "/" + name);
    std::string v;
    in >> v;
    return v;
  };
  const std::string max = read("memory.max"), cur = read("memory.current");
  if (max.empty() || max == "max" || cur.empty()) return 0;
  try {
    return std::max(0.0, std::stod(max) - std::stod(cur));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

std::optional<ActivationEstimate> estimate_activations(const nlohmann::json& config, const ActivationShape& s) {
  if (!config.is_object()) return std::nullopt;
  const nlohmann::json& c = config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
  const double hidden = size_of(c, "hidden_size"), layers = size_of(c, "num_hidden_layers"), vocab = size_of(c, "vocab_size");
  if (hidden == 0 || layers == 0 || vocab == 0 || s.sequence_len <= 0) return std::nullopt;
  const double experts_per_token = std::max(size_of(c, "num_experts_per_tok"), 1.0);
  const double moe_inter = size_of(c, "moe_intermediate_size");
  const bool moe = size_of(c, "num_experts") > 0 || size_of(c, "num_local_experts") > 0;
  // A dense layer's MLP, or the experts a token is routed to (the widest, when a model mixes both).
  const double inter = std::max(size_of(c, "intermediate_size") * (moe && moe_inter == 0 ? experts_per_token : 1.0),
                                moe ? experts_per_token * moe_inter : 0.0);
  const double tokens = static_cast<double>(s.rows) * static_cast<double>(s.sequence_len) /
                        static_cast<double>(std::max<int64_t>(s.context_parallel, 1));
  const double b = static_cast<double>(s.dtype_bytes);
  const double layer = (4 * hidden + 3 * inter / static_cast<double>(std::max<int64_t>(s.mlp_tiles, 1))) * b;  // one layer's kept tensors, per token
  const double inputs = s.activation_offload ? std::min(layers, 2.0) : layers;  // layer inputs on the device
  const double kept = s.activation_checkpointing ? inputs * hidden * b + layer : layers * layer;
  double bytes = tokens * (kept + 3 * 8.0);  // + input ids, labels, positions (int64)
  std::string detail = str(s.rows, " x ", s.sequence_len, " tokens x ",
                           s.activation_checkpointing ? (s.activation_offload ? "(2 layer inputs, activation checkpointing with offload)"
                                                                                : "(layer inputs, activation checkpointing)")
                                                      : str(layers, " layers"));
  if (s.logits_whole) {
    bytes += tokens * vocab * (b + 4);  // the logits, and their fp32 log-softmax
    detail += str(" + logits over a vocabulary of ", vocab);
  }
  if (s.attention_scores) {
    const double heads = std::max(size_of(c, "num_attention_heads"), 1.0);
    bytes += heads * 64 * static_cast<double>(s.sequence_len) * 4;  // one fp32 block: 64 queries x a row's keys
    detail += " + attention scores";
  }
  return ActivationEstimate{bytes, detail};
}

std::optional<int64_t> choose_mlp_tiles(const nlohmann::json& config, ActivationShape shape, double memory_bytes) {
  const int64_t tokens = shape.rows * shape.sequence_len / std::max<int64_t>(shape.context_parallel, 1);
  const int64_t most = std::max<int64_t>(1, tokens / kAutoTileMinTokens);
  for (int64_t n = 1;; n *= 2) {
    shape.mlp_tiles = std::min(n, most);
    const auto need = estimate_activations(config, shape);
    if (!need) return std::nullopt;
    if (need->bytes <= kAutoTileShare * memory_bytes || n >= most) return shape.mlp_tiles;
  }
}

std::optional<DeviceMemory> device_memory(const DeviceInfo& device) {
  if (device.is_cuda()) {
    if (device.arch_source != "detected") {  // an override: only the GPU really there can say
      auto gpu = physical_gpu(device.index);
      if (!gpu || gpu->arch != device.arch) return std::nullopt;
    }
    auto total = gpu_total_memory(device.index);
    if (!total) return std::nullopt;
    return DeviceMemory{static_cast<double>(*total), str("total memory of ", device.name, ", CUDA device ", device.index)};
  }
  DeviceMemory m{proc_kb("/proc/meminfo", "MemAvailable"), "MemAvailable in /proc/meminfo"};
  if (const double room = cgroup_room(); room > 0 && (m.bytes == 0 || room < m.bytes)) m = {room, "the cgroup's memory.max less its usage"};
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const double room = std::max(0.0, static_cast<double>(as.rlim_cur) - proc_kb("/proc/self/status", "VmSize"));
    if (m.bytes == 0 || room < m.bytes) m = {room, "RLIMIT_AS (ulimit -v) less the address space in use"};
  }
  if (m.bytes == 0) return std::nullopt;
  return m;
}

}  // namespace ax::train
