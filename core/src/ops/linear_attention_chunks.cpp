// The padded chunk layout of packed sequences (axengine/ops/linear_attention_chunks.hpp): index maps built
// on the device from cu_seqlens with searchsorted, no host read.
#include "axengine/ops/linear_attention_chunks.hpp"

#include <ATen/ATen.h>

namespace ax::ops {

ChunkLayout chunk_layout(const at::Tensor& cu_seqlens, int64_t T, int64_t C) {
  ChunkLayout l;
  l.C = C;
  const auto opt = cu_seqlens.options().dtype(at::kLong);
  const int64_t N = cu_seqlens.size(0) - 1;
  at::Tensor cu = cu_seqlens.to(at::kLong);
  at::Tensor lens = cu.slice(0, 1) - cu.slice(0, 0, N);
  at::Tensor nch = at::floor_divide(lens + (C - 1), C);
  at::Tensor cc = at::cat({at::zeros({1}, opt), at::cumsum(nch, 0)});  // [N+1] chunk offsets
  l.chunk_begin = cc;
  l.NC = T / C + N;
  at::Tensor chunk = at::arange(l.NC, opt);
  l.seq = at::searchsorted(cc, chunk, /*out_int32=*/false, /*right=*/true) - 1;  // N past the last chunk
  const at::Tensor real = l.seq < N;
  l.first = real & (cc.index_select(0, l.seq) == chunk);
  l.last = real & (cc.index_select(0, (l.seq + 1).clamp_max(N)) - 1 == chunk);
  // Padded slot (chunk c, row i) holds sequence position (c − cc[seq])·C + i, when that is inside it.
  at::Tensor lens_ext = at::cat({lens, at::zeros({1}, opt)});
  at::Tensor pos = ((chunk - cc.index_select(0, l.seq)) * C).unsqueeze(1) + at::arange(C, opt).unsqueeze(0);
  at::Tensor inside = real.unsqueeze(1) & (pos < lens_ext.index_select(0, l.seq).unsqueeze(1));
  l.src = at::where(inside, cu.index_select(0, l.seq).unsqueeze(1) + pos, at::full({}, T, opt)).reshape({-1});
  at::Tensor rows = at::arange(T, opt);
  at::Tensor s = at::searchsorted(cu, rows, /*out_int32=*/false, /*right=*/true) - 1;
  at::Tensor p = rows - cu.index_select(0, s);
  l.dest = (cc.index_select(0, s) + at::floor_divide(p, C)) * C + at::remainder(p, C);
  l.nonempty = nch > 0;
  l.first_chunk = cc.slice(0, 0, N).clamp_max(l.NC - 1);
  l.last_chunk = (cc.slice(0, 1) - 1).clamp(0, l.NC - 1);
  return l;
}

at::Tensor to_chunks(const at::Tensor& x, const ChunkLayout& l) {
  auto zero_shape = x.sizes().vec();
  zero_shape[0] = 1;
  at::Tensor padded = at::cat({x, at::zeros(zero_shape, x.options())}).index_select(0, l.src);
  auto shape = x.sizes().vec();
  shape[0] = l.C;
  shape.insert(shape.begin(), l.NC);
  return padded.view(shape).transpose(1, 2).contiguous();
}

at::Tensor from_chunks(const at::Tensor& x, const ChunkLayout& l) {
  at::Tensor rows = x.transpose(1, 2);
  auto shape = rows.sizes().vec();
  shape.erase(shape.begin());
  shape[0] = l.NC * l.C;
  return rows.reshape(shape).index_select(0, l.dest);
}

}  // namespace ax::ops
