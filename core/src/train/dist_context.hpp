// Context parallelism's process groups ([distributed] context_parallel = N, docs/distributed.md): the world
// splits into groups of N consecutive ranks; the ranks of a group train the same micro-batches (data-parallel
// rank = rank / N, world = data-parallel ranks x N), each through its 1/N of every row's tokens
// (models/context_parallel.hpp). Gradients are still averaged over the whole world by the reducer: each rank's
// holds its share of its micro-batch's loss, so the trainer scales its backward by N (TrainerSetup).
#pragma once
#include <memory>

#include "axengine/config.hpp"
#include "models/context_parallel.hpp"
#include "train/dist_config.hpp"
#include "train/dist_group.hpp"

namespace ax::train {

struct ContextParallelGroups {
  std::unique_ptr<DistGroup> group;             // this rank's context-parallel group (N ranks)
  std::shared_ptr<models::ContextComm> comm;    // `group` as the model sees it
};

// Forms the groups (every rank calls it). `size` divides the world: checked here, naming the key.
ContextParallelGroups make_context_parallel(DistGroup& world, int64_t size);

// What a run with context_parallel > 1 needs, checked before any weight is read (plan_run), each error at the
// key's file:line:col: N divides the world (when launched) and data.sequence_len; not with expert_parallel > 1
// or shard_base; a family whose token mixing is attention over whole rows (not MLA, linear-attention hybrids
// or qwen2_5_vl's vision tower).
void check_context_parallel(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, int64_t sequence_len);

}  // namespace ax::train
