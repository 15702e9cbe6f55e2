// See plan.hpp.
#include "plan.hpp"

#include <algorithm>

namespace ax::fused_attn::plan {

int vector_width(int elem_bytes) { return kVectorBytes / elem_bytes; }

bool vectorisable(int64_t cols, int elem_bytes, std::initializer_list<Operand> operands) {
  const int vec = vector_width(elem_bytes);
  if (cols % vec != 0) return false;
  for (const Operand& o : operands) {
    if (o.col_stride != 1 && cols > 1) return false;
    if (o.address % kVectorBytes != 0) return false;
    for (int64_t s : o.row_strides)
      if (s % vec != 0) return false;
  }
  return true;
}

std::optional<int64_t> collapse(const int64_t* sizes, const int64_t* strides, int n) {
  for (int i = 0; i < n; ++i)
    if (sizes[i] == 0) return int64_t{0};
  bool have = false;
  int64_t inner = 0, expected = 0;
  for (int i = n - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (!have) {
      have = true;
      inner = strides[i];
    } else if (strides[i] != expected) {
      return std::nullopt;
    }
    expected = strides[i] * sizes[i];
  }
  return have ? inner : 0;
}

int norm_rope_lanes(int64_t D, int vec) { return (D + vec - 1) / vec <= 16 ? 16 : 32; }

int norm_rope_rows_in_parallel(int lanes) { return kNormRopeThreads / lanes; }

int norm_rope_tokens_per_iteration(int64_t heads, int rows_in_parallel) {
  if (heads >= rows_in_parallel) return 1;
  return static_cast<int>(std::clamp<int64_t>(rows_in_parallel / std::max<int64_t>(heads, 1), 1, 16));
}

int norm_rope_group_lanes(int64_t D, int64_t R, int vec, bool vectorised) {
  if (!vectorised || vec != 8 || (D != 64 && D != 128) || R % 16 != 0 || R > D) return 0;
  return static_cast<int>(D / vec);
}

int64_t norm_rope_items(int64_t tokens, int64_t heads) {
  return tokens * ((heads + kNormRopeHeadRun - 1) / kNormRopeHeadRun);
}

int64_t norm_rope_smem_bytes(int tokens_per_iteration, int64_t R, int rows_in_parallel, int64_t D) {
  return (2 * tokens_per_iteration * R + rows_in_parallel * D + D) * static_cast<int64_t>(sizeof(float));
}

NormRopeShape norm_rope_shape(int64_t D, int64_t heads, int vec) {
  NormRopeShape s;
  s.lanes = norm_rope_lanes(D, vec);
  s.rows_in_parallel = norm_rope_rows_in_parallel(s.lanes);
  s.tokens_per_iteration = norm_rope_tokens_per_iteration(heads, s.rows_in_parallel);
  return s;
}

RowShape rms_norm_shape(int64_t H, int vec, int chunks_cap) {
  const int64_t chunks = (H + vec - 1) / vec;
  RowShape s;
  const int64_t per_thread = (chunks + chunks_cap - 1) / chunks_cap;
  s.threads = static_cast<int>(std::clamp<int64_t>((per_thread + 31) / 32 * 32, 32, 1024));
  s.chunks = static_cast<int>((chunks + s.threads - 1) / s.threads);
  return s;
}

int reduction_blocks(int64_t rows, int64_t rows_per_block, int sm_count, int blocks_per_sm) {
  const int64_t want = (rows + rows_per_block - 1) / rows_per_block;
  const int64_t cap = static_cast<int64_t>(std::max(sm_count, 1)) * std::max(blocks_per_sm, 1);
  return static_cast<int>(std::clamp<int64_t>(want, 1, cap));
}

int64_t row_blocks(int64_t rows, int64_t rows_per_block) {
  return std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, kReduceRowsMax);
}

Tile swiglu_tile(int64_t vectors_per_row) {
  Tile t;
  t.bx = 1;
  while (t.bx < 256 && t.bx < vectors_per_row) t.bx *= 2;
  t.by = 256 / t.bx;
  return t;
}

int64_t linear_ce_chunk_rows(int64_t T, int64_t V, int elem_bytes, int64_t chunk_bytes) {
  if (T <= 0) return 0;
  const int64_t row_bytes = std::max<int64_t>(V, 1) * elem_bytes;
  const int64_t rows = std::max<int64_t>(chunk_bytes / row_bytes / 64 * 64, 64);
  return std::min(rows, T);
}

}  // namespace ax::fused_attn::plan
