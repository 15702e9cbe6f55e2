#include "train/dist_config.hpp"

#include <cerrno>
#include <cstdlib>

#include "axengine/config_binder.hpp"
#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {
namespace {

void bind_distributed(TableBinder& t, DistributedConfig& c) {
  t.choice("backend", c.backend, {"auto", "nccl", "gloo"},
           "c10d backend of the process group (runs started by torchrun or axengine launch): auto = nccl on CUDA devices, gloo on the CPU");
  t.positive("bucket_mb", c.bucket_mb, "LoRA gradients are all-reduced in flat buckets of about this many MiB (one collective each)");
  t.bounded("timeout_s", c.timeout_s, 1, 7 * 24 * 3600,
            "seconds a rendezvous or collective may wait for the other ranks before the run fails (a dead or stuck rank); "
            "rank 0 evaluates alone, so it must exceed an evaluation's time");
  t.bounded("expert_parallel", c.expert_parallel, 1, 1 << 20,
            "MoE models: ranks per expert-parallel group; each holds (and trains the LoRA of) 1/N of every MoE layer's "
            "experts, tokens travel to them by all-to-all. Must divide the world size and the number of experts");
  t.bounded("context_parallel", c.context_parallel, 1, 1 << 20,
            "ranks per context-parallel group: they train the same micro-batches, each holding 1/N of every packed "
            "row's tokens through the layers (zig-zag chunks r and 2N-1-r of 2N; ring attention: K/V blocks travel "
            "between the ranks, each attends its own queries); world = data-parallel x context_parallel. Must divide "
            "the world size, and 2N must divide data.sequence_len. Dense, MoE and MLA attention families and the Gated "
            "DeltaNet hybrids (their conv window and recurrent state handed along each row's chunks); not "
            "vision-language models, not with expert_parallel > 1 or shard_base; "
            "docs/distributed.md, \"Context parallelism\"");
  t.field("shard_base", c.shard_base,
          "each rank keeps 1/world of every decoder layer's frozen weights (dense or packed) and all-gathers a layer "
          "just before it runs, in forward and again in backward (the layer is recomputed: implies activation "
          "checkpointing); embeddings, final norm and lm_head stay whole. Not with expert_parallel > 1 or eval.exact_match");
}

void bind_distributed_section(TableBinder& t, RunConfig&) { DistributedConfig c; bind_distributed(t, c); }

struct Registrar {
  Registrar() {
    register_config_section({"distributed", "multi-process training (torchrun / axengine launch): backend, gradient buckets, timeout",
                             bind_distributed_section});
  }
} registrar;

// An integer environment variable in [lo, hi], `fallback` when unset.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    throw UsageError(ax::str("environment: ", name, "=\"", v, "\" is not an integer in [", lo, ", ", hi, "]"));
  return x;
}

}  // namespace

DistributedConfig read_distributed_config(const RunConfig& config) {
  DistributedConfig c;
  const toml::node* n = config.document.get("distributed");
  TableBinder t(n ? n->as_table() : nullptr, "distributed", BindContext{config.file, nullptr});
  bind_distributed(t, c);
  if (n && n->as_table()) {
    c.expert_parallel_at = n->as_table()->get("expert_parallel");
    c.shard_base_at = n->as_table()->get("shard_base");
    c.context_parallel_at = n->as_table()->get("context_parallel");
  }
  return c;
}

DistEnv read_dist_env() {
  DistEnv e;
  e.world = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  const char* rank = std::getenv("RANK");
  if (e.world == 1 && (!rank || !*rank)) return e;
  e.launched = true;
  e.rank = env_int("RANK", -1, 0, e.world - 1);
  if (e.rank < 0) throw UsageError(ax::str("environment: WORLD_SIZE=", e.world, " but RANK is not set"));
  e.local_rank = env_int("LOCAL_RANK", 0, 0, e.world - 1);
  e.local_world = env_int("LOCAL_WORLD_SIZE", 1, 1, e.world);
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr) throw UsageError(ax::str("environment: WORLD_SIZE=", e.world, " but MASTER_ADDR is not set"));
  e.master_addr = addr;
  e.master_port = env_int("MASTER_PORT", -1, 1, 65535);
  if (e.master_port < 0) throw UsageError(ax::str("environment: WORLD_SIZE=", e.world, " but MASTER_PORT is not set"));
  return e;
}

}  // namespace ax::train
