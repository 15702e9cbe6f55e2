// The fused_attn backends' options: the table [kernels.options.fused_attn] of the run config, bound by the
// engine with the rest of the config (docs/plugins/fused_attn.md, "Options"). Plain C++ (no CUDA).
#pragma once
#include <axengine/config_binder.hpp>
#include <cstdint>

namespace ax::fused_attn {

struct Options {
  // linear_ce: the logits of one chunk of tokens ([Tc, V] in the compute dtype) stay within this many MiB.
  int64_t linear_ce_chunk_mib = 256;
};

void bind_options(TableBinder& table, Options& options);

}  // namespace ax::fused_attn
