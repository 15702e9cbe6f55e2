// Static batch shapes for CUDA-graph replay ([compile] static_shapes): a packed micro-batch's cu_seqlens has
// one entry per sample, so its length changes from batch to batch and every new length is a new graph. Padded
// to a fixed number of spans with empty ones (repeats of the last offset) and with max_seqlen set to the row
// length, every micro-batch of a run has one shape signature. Empty spans add no tokens and no loss: the
// model computes the same as on the unpadded batch.
#pragma once
#include <cstdint>
#include <vector>

#include "axengine/model.hpp"

namespace ax::data {

// Pads `batch` (on the host, as make_batch built it) to `capacity` spans. Throws RuntimeError when it has more.
void pad_static(Batch& batch, int64_t capacity);

// The most cu_seqlens spans any micro-batch of `rows_per_batch` rows of `rows` can have: each row holds its
// samples plus, where it is not full, one padding span.
int64_t span_capacity(const std::vector<std::vector<uint32_t>>& rows, int64_t rows_per_batch);

}  // namespace ax::data
