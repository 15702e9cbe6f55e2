// The chunked QLoRA linear behind nf4::linear_forward / linear_backward (nf4.hpp), with the chunk size
// exposed so that tests can force many chunks on small shapes.
#pragma once
#include <cstdint>

#include "nf4.hpp"

namespace ax::nf4 {

// Elements of W decoded per chunk: 8 Mi elements (16 MiB in bf16/fp16, a sixth of a [12288, 4096] weight).
// The forward decodes blocks of rows of W [N, K], the backward blocks of columns; a chunk is rounded down
// to a multiple of 128 rows / columns (at least 128, at most the whole dimension) so that each GEMM's
// output is whole 128-wide tiles and, at Qwen3-8B sizes, at least one full wave of them. Fixed, so
// results are bitwise repeatable.
constexpr int64_t kChunkElems = int64_t{1} << 23;

// Rows (forward) or columns (backward) per chunk for a dimension `dim` and the other one `other`.
int64_t chunk_extent(int64_t dim, int64_t other, int64_t chunk_elems);

at::Tensor linear_forward_chunked(const ops::LinearLoraArgs& args, int64_t chunk_elems);
ops::LinearLoraGrads linear_backward_chunked(const ops::LinearLoraArgs& args, const ops::LinearLoraBackwardArgs& bwd,
                                             int64_t chunk_elems);

}  // namespace ax::nf4
