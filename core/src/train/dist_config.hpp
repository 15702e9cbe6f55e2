// The [distributed] section and torchrun's environment contract (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT): what a process needs to know to join a process group. docs/distributed.md.
#pragma once
#include <cstdint>
#include <string>

#include "axengine/config.hpp"

namespace ax::train {

struct DistributedConfig {
  std::string backend = "auto";  // auto (nccl on CUDA, gloo on the CPU) | nccl | gloo
  double bucket_mb = 25;         // gradients are all-reduced in flat buckets of about this size
  int64_t timeout_s = 1800;      // a collective (or the rendezvous) that waits longer fails the run
  int64_t expert_parallel = 1;   // ranks per expert-parallel group (1: every rank holds every expert)
  const toml::node* expert_parallel_at = nullptr;  // the key in the config, for errors found later (run_check)
  int64_t context_parallel = 1;  // ranks per context-parallel group (1: each rank holds whole rows)
  const toml::node* context_parallel_at = nullptr;
  bool shard_base = false;       // each rank keeps 1/world of every layer's frozen tensors (dist_shard_base.hpp)
  const toml::node* shard_base_at = nullptr;
};

DistributedConfig read_distributed_config(const RunConfig& config);

// The torchrun variables of this process. A process group is joined when `launched`: WORLD_SIZE > 1, or a
// launcher started one rank (WORLD_SIZE=1 with RANK set: `torchrun --nproc-per-node 1`, `axengine launch
// --nproc 1`), which is how the cost of the group itself is measured (bench/dist_overhead.sh).
struct DistEnv {
  bool launched = false;
  int64_t rank = 0, local_rank = 0, world = 1, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
};

// Reads the variables; UsageError naming the variable when one is malformed or inconsistent
// (RANK outside [0, WORLD_SIZE), MASTER_PORT outside [1, 65535], WORLD_SIZE > 1 without MASTER_ADDR/PORT).
DistEnv read_dist_env();

}  // namespace ax::train
