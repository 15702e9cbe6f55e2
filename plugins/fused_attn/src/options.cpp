// See options.hpp.
#include "options.hpp"

namespace ax::fused_attn {

void bind_options(TableBinder& t, Options& o) {
  t.bounded("linear_ce_chunk_mib", o.linear_ce_chunk_mib, 16, 65536,
            "linear_ce: MiB of logits per chunk of tokens ([Tc, V] in the compute dtype, Tc a multiple of 64); "
            "the forward and the backward each hold one chunk, so this bounds the op's extra memory");
}

}  // namespace ax::fused_attn
