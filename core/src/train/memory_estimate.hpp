// Will a micro-batch's activations fit at all? A lower bound on what training keeps alive for one micro-batch of
// rows of data.sequence_len tokens, from the model's config.json, and the memory the device has: the run check
// (run_check.cpp) refuses a sequence length whose bound alone exceeds it, before any weight loads, instead of a
// run that dies out of memory at step 1, or swaps for hours. Deliberately low (it counts only tensors the
// backward pass cannot do without), so a refused run could not have run, and a run that passes may still not fit.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "axengine/device.hpp"

namespace ax::train {

struct ActivationShape {
  int64_t rows = 1;                  // micro_batch_size
  int64_t sequence_len = 0;          // tokens a row (padding included: rows are always this long)
  int64_t dtype_bytes = 4;           // the compute dtype's
  bool activation_checkpointing = false;
  bool activation_offload = false;   // with checkpointing, on a GPU: the layer inputs wait in host memory
  int64_t mlp_tiles = 1;             // [train] tiled_mlp: the MLP's intermediates exist for 1/tiles of the tokens
  int64_t context_parallel = 1;      // [distributed] context_parallel: a rank holds 1/N of every row's tokens
  bool logits_whole = false;         // the linear_ce backend forms the [tokens, vocab] logits (the reference)
  bool attention_scores = false;     // the attention backend forms score blocks over a row (the reference)
};

struct ActivationEstimate {
  double bytes = 0;
  std::string detail;  // what it counts, for the message
};

// nullopt when config.json lacks the sizes it needs (hidden_size, num_hidden_layers, vocab_size; a
// vision-language model's text_config is read). Per token and layer: the layer input, the two norm outputs and
// the attention output (4 x hidden) and the MLP's gate, up and their product (3 x intermediate; MoE: top-k
// experts' intermediate), or, with activation checkpointing, the layer input only plus one layer's recompute
// (offloaded: two layer inputs, the one in backward and the one prefetched, instead of every layer's; the MLP's
// intermediates over tiled_mlp: one shard's tokens at a time);
// the reference linear_ce's logits and fp32 log-softmax; the reference attention's score block of 64 queries
// against a whole row per head.
std::optional<ActivationEstimate> estimate_activations(const nlohmann::json& hf_config, const ActivationShape& shape);

// [train] tiled_mlp = "auto": the shard count for `shape` (its mlp_tiles ignored) on a device of `memory_bytes`.
// 1 when estimate_activations fits kAutoTileShare of the memory (the rest is the weights', the optimizer's and the
// allocator's); else the smallest power of two whose estimate fits it; never more shards than leave a shard
// kAutoTileMinTokens tokens of a micro-batch (smaller GEMMs waste the device), which is the answer too when no
// count fits (the run check then says whether the bound fits the memory at all). nullopt: no estimate.
inline constexpr double kAutoTileShare = 0.5;
inline constexpr int64_t kAutoTileMinTokens = 1024;
std::optional<int64_t> choose_mlp_tiles(const nlohmann::json& hf_config, ActivationShape shape, double memory_bytes);

struct DeviceMemory {
  double bytes = 0;
  std::string source;  // "total memory of NVIDIA H100 ...", "MemAvailable in /proc/meminfo", "RLIMIT_AS ..."
};

// What the run can use: a GPU's total memory (as the driver reports it, no context made); on the CPU the least
// of MemAvailable, the cgroup's memory.max less its usage, and RLIMIT_AS less the address space in use.
// nullopt when unknown (a GPU planned for with an arch override, not present).
std::optional<DeviceMemory> device_memory(const DeviceInfo& device);

}  // namespace ax::train
