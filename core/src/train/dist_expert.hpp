// Expert parallelism's process groups ([distributed] expert_parallel = N, docs/distributed.md): the world
// splits into groups of N consecutive ranks, each holding every expert once (rank r of a group: experts
// [r·E/N, (r+1)·E/N)); tokens travel inside a group (all-to-all). The ranks at one position in different
// groups hold the same experts: their expert LoRA gradients are reduced among them (the "replica" group),
// while the replicated parameters are still averaged over the whole world.
#pragma once
#include <memory>
#include <string>

#include "axengine/config.hpp"
#include "axengine/expert_parallel.hpp"
#include "train/dist_config.hpp"
#include "train/dist_group.hpp"

namespace ax::train {

struct ExpertParallelGroups {
  std::unique_ptr<DistGroup> experts;   // this rank's expert-parallel group (N ranks)
  std::unique_ptr<DistGroup> replicas;  // the ranks holding the same experts (world / N ranks)
  std::shared_ptr<ExpertComm> comm;     // `experts` as the model sees it
};

// Forms both sub groups (every rank calls it; c10d needs each group's members to create it together).
// `size` divides the world: checked here, naming the key.
ExpertParallelGroups make_expert_parallel(DistGroup& world, int64_t size);

// What a run with `expert_parallel` > 1 needs, checked before any weight is read (plan_run), each error at
// the key's file:line:col: the world (when launched) and the model's expert count divisible by it, no resume
// (the checkpoint's optimizer state is rank 0's shard only) and no eval.exact_match (generation does not
// dispatch). Nothing to check for a process no launcher started (the table has no effect there).
void check_expert_parallel(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, bool resuming,
                           bool exact_match);

// Whether a trainable parameter belongs to the experts (sharded over the expert-parallel group): the LoRA
// factors of a fused experts module (DecoderModel::trainable_parameters names them <site path>.lora_A/B).
bool is_expert_parameter(const std::string& name);

}  // namespace ax::train
