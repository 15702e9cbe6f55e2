// Sequence packing: samples are laid end to end in rows of `sequence_len` tokens. Each sample keeps its
// own positions (restarting at 0) and its own attention span (cu_seqlens, for varlen attention), and the
// label of its first token is masked so no sample learns to predict the start of the next one. The rest
// of a row is padding: its own span, labels masked.
#pragma once
#include <cstdint>
#include <vector>

#include "axengine/dataset.hpp"
#include "axengine/model.hpp"

namespace ax::data {

// A deterministic permutation of 0..n-1 from `seed` (splitmix64 + Fisher-Yates: the same on every platform
// and standard library, which resume and the prepared-data cache rely on).
std::vector<uint32_t> permutation(std::size_t n, uint64_t seed);
uint64_t mix_seed(uint64_t a, uint64_t b);

struct PackedRows {
  std::vector<std::vector<uint32_t>> rows;  // sample indices, in row order
  std::size_t truncated = 0;                // samples longer than sequence_len (cut to it)
  std::size_t tokens = 0;                   // real (non-padding) tokens
};

// Packs samples in `order`, first fit into the current row: a sample that does not fit starts a new row.
PackedRows pack_samples(const std::vector<Sample>& samples, const std::vector<uint32_t>& order, int64_t sequence_len);

// The batch of rows `rows[row_ids[0..]]`: [B, S] tensors on CPU, with the host facts (cu_seqlens_host, the
// token id range) a device forward needs without a sync. Padding uses `pad_id` (0 when < 0). When a sample
// carries extras, `collator` (the dataset type that made them) collates the batch's extras; without one
// that is a UsageError.
Batch make_batch(const std::vector<Sample>& samples, const PackedRows& packed, const std::vector<uint32_t>& row_ids,
                 int64_t sequence_len, int32_t pad_id, const DatasetType* collator = nullptr);

}  // namespace ax::data
