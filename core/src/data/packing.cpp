#include "data/packing.hpp"

#include <algorithm>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::data {

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<uint32_t> permutation(std::size_t n, uint64_t seed) {
  std::vector<uint32_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>(i);
  uint64_t state = seed;
  for (std::size_t i = n; i > 1; --i) {
    state = mix_seed(state, i);
    // Multiply-shift maps 64 random bits onto [0, i) without modulo bias worth worrying about at these sizes.
    std::size_t j = static_cast<std::size_t>((static_cast<unsigned __int128>(state) * i) >> 64);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

PackedRows pack_samples(const std::vector<Sample>& samples, const std::vector<uint32_t>& order, int64_t sequence_len) {
  PackedRows out;
  std::vector<uint32_t> row;
  int64_t used = 0;
  for (uint32_t idx : order) {
    int64_t len = static_cast<int64_t>(samples[idx].input_ids.size());
    if (len > sequence_len) {
      ++out.truncated;
      len = sequence_len;
    }
    if (used + len > sequence_len && !row.empty()) {
      out.rows.push_back(std::move(row));
      row.clear();
      used = 0;
    }
    row.push_back(idx);
    used += len;
    out.tokens += static_cast<std::size_t>(len);
  }
  if (!row.empty()) out.rows.push_back(std::move(row));
  return out;
}

Batch make_batch(const std::vector<Sample>& samples, const PackedRows& packed, const std::vector<uint32_t>& row_ids,
                 int64_t S, int32_t pad_id, const DatasetType* collator) {
  const int64_t B = static_cast<int64_t>(row_ids.size());
  auto ids = at::empty({B, S}, at::kLong), labels = at::empty({B, S}, at::kLong), pos = at::empty({B, S}, at::kLong);
  int64_t* pi = ids.data_ptr<int64_t>();
  int64_t* pl = labels.data_ptr<int64_t>();
  int64_t* pp = pos.data_ptr<int64_t>();
  std::vector<int32_t> cu{0};
  int64_t max_len = 0;
  const int64_t pad = pad_id >= 0 ? pad_id : 0;
  BatchLayout layout{B, S, {}};
  bool extras = false, padded = false;
  at::Tensor mask;  // made at the first padding
  for (int64_t b = 0; b < B; ++b) {
    if (row_ids[b] >= packed.rows.size()) throw RuntimeError(ax::str("packed row ", row_ids[b], " out of range"));
    int64_t t = b * S, end = (b + 1) * S;
    for (uint32_t idx : packed.rows[row_ids[b]]) {
      const Sample& s = samples[idx];
      int64_t len = std::min<int64_t>(static_cast<int64_t>(s.input_ids.size()), end - t);
      layout.samples.push_back({&s, b, t - b * S, len});
      extras |= !s.extras.empty();
      for (int64_t k = 0; k < len; ++k, ++t) {
        pi[t] = s.input_ids[k];
        pl[t] = k == 0 ? -100 : s.labels[k];
        pp[t] = k;
      }
      cu.push_back(static_cast<int32_t>(t));
      max_len = std::max(max_len, len);
    }
    if (t < end) {  // padding: one span of its own, no loss
      int64_t len = end - t;
      if (!padded) mask = at::ones({B, S}, at::kLong);
      padded = true;
      mask[b].narrow(0, t - b * S, len).zero_();
      for (int64_t k = 0; k < len; ++k, ++t) {
        pi[t] = pad;
        pl[t] = -100;
        pp[t] = k;
      }
      cu.push_back(static_cast<int32_t>(t));
      max_len = std::max(max_len, len);
    }
  }
  Batch batch;
  batch.input_ids = ids;
  batch.labels = labels;
  batch.position_ids = pos;
  batch.cu_seqlens = at::tensor(cu, at::kInt);
  batch.max_seqlen = max_len;
  batch.cu_seqlens_host = batch.cu_seqlens;
  if (B > 0) {
    batch.min_token_id = ids.min().item<int64_t>();
    batch.max_token_id = ids.max().item<int64_t>();
  }
  if (extras) {
    if (!collator) throw UsageError("the samples of a batch carry extras but no dataset type was given to collate them");
    batch.extras = collator->collate(layout);
    if (batch.extras.count("attention_mask"))
      throw UsageError("a dataset type's collate() returned the extra \"attention_mask\": that name is the batch's padding mask");
  }
  // Where rows end in padding, its mask (1 = token, 0 = padding), as transformers' attention_mask: MoE models
  // leave padding out of the router aux loss with it. Attention needs none (padding is a span of its own).
  if (padded) batch.extras["attention_mask"] = mask;
  return batch;
}

}  // namespace ax::data
