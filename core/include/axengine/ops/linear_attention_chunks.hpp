// The padded chunk layout of packed sequences that chunked linear_attention backends share (core's `aten`
// backend, kernel plugins): every sequence's rows are cut into chunks of C rows, each chunk gets a slot of
// one padded [NC, C] layout, and rows move in and out by gathers. NC = T/C + N bounds the chunk count from
// the shapes alone (Σ ceil(len/C) <= floor(T/C) + N), so building the layout reads no tensor value on the
// host: graph-safe. docs/ops/linear_attention.md, "Backends".
#pragma once
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace ax::ops {

struct ChunkLayout {
  int64_t C = 0;           // rows per chunk
  int64_t NC = 0;          // chunk slots: T/C + N
  at::Tensor src;          // int64 [NC·C]: the packed row of each padded row, T for padding
  at::Tensor dest;         // int64 [T]: the padded row of each packed row
  at::Tensor seq;          // int64 [NC]: the chunk's sequence, N for slots past the last chunk
  at::Tensor first;        // bool [NC]: the chunk is its sequence's first
  at::Tensor last;         // bool [NC]: the chunk is its sequence's last
  at::Tensor chunk_begin;  // int64 [N+1]: sequence b owns slots [chunk_begin[b], chunk_begin[b+1])
  at::Tensor first_chunk;  // int64 [N]: each sequence's first slot (clamped into range)
  at::Tensor last_chunk;   // int64 [N]: each sequence's last slot (clamped into range)
  at::Tensor nonempty;     // bool [N]
};

// The layout of `cu_seqlens` (int32 [N+1], on the rows' device) for T rows, on that device.
ChunkLayout chunk_layout(const at::Tensor& cu_seqlens, int64_t T, int64_t C);

// [T, H, ...] packed rows → [NC, H, C, ...] chunks (contiguous), zero in the padding.
at::Tensor to_chunks(const at::Tensor& rows, const ChunkLayout& layout);
// The inverse: [NC, H, C, ...] → [T, H, ...].
at::Tensor from_chunks(const at::Tensor& chunks, const ChunkLayout& layout);

}  // namespace ax::ops
