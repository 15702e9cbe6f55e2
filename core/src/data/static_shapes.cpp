#include "data/static_shapes.hpp"

#include <algorithm>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::data {

void pad_static(Batch& batch, int64_t capacity) {
  if (!batch.cu_seqlens.defined() || !batch.cu_seqlens.is_cpu())
    throw RuntimeError("pad_static: the batch has no cu_seqlens on the host");
  const int64_t spans = batch.cu_seqlens.numel() - 1;
  if (spans > capacity)
    throw RuntimeError(ax::str("pad_static: the batch has ", spans, " spans, more than the capacity ", capacity));
  if (spans < capacity) {
    at::Tensor cu = batch.cu_seqlens.to(at::kInt);
    at::Tensor tail = at::full({capacity - spans}, cu[-1].item<int32_t>(), at::kInt);  // empty spans: no tokens
    batch.cu_seqlens = at::cat({cu, tail});
  }
  batch.cu_seqlens_host = batch.cu_seqlens;
  batch.max_seqlen = batch.input_ids.size(1);  // a bound, not the longest span: the same for every batch
}

int64_t span_capacity(const std::vector<std::vector<uint32_t>>& rows, int64_t rows_per_batch) {
  std::size_t most = 0;
  for (const auto& row : rows) most = std::max(most, row.size());
  return rows_per_batch * (static_cast<int64_t>(most) + 1);
}

}  // namespace ax::data
