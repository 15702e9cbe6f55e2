// Launch and shape dispatch of the grouped GEMM whose main W is packed (nf4 / mxfp4 / nvfp4,
// weight_formats.cuh). Packed GEMMs take a fixed tile (128x16 for rank-r outputs, else 128x128: the
// tuner is not consulted, its keys do not carry the format); the launch differs from launch_grouped only
// in the W bit of the vector mask (256: the packed loader's aligned path). Tile shapes do not change the
// per-element accumulation order (k tiles in sequence, then the LoRA k tiles), which the bitwise
// dense-vs-packed parity test relies on.
// One .cu file per format instantiates it (moe_gemm_<format>.cu), so the formats compile in parallel.
#pragma once
#include <type_traits>

#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {

template <class T, int BM, int BN, int WM, int WN, bool W_KMAJ, bool W2_KMAJ, WeightFormat F, bool BLK_ROWS>
void launch_grouped_packed(const GroupedGemmArgs& a, cudaStream_t stream) {
  using K_ = Kernel<T, BM, BN, WM, WN, W_KMAJ, W2_KMAJ, false>;
  // 64-bit row arithmetic always: it is hoisted out of the k loop, where the decode work dominates, and
  // it saves a second set of packed instantiations.
  auto kern = moe_gemm_kernel<T, BM, BN, WM, WN, W_KMAJ, W2_KMAJ, false, /*IDX64=*/true, GroupedGemmArgs, F, BLK_ROWS>;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, K_::SMEM_BYTES);
  const int n_tiles_n = (a.N + BN - 1) / BN;
  const int64_t max_tiles = (a.M + BM - 1) / BM + a.E;  // each expert adds at most one partial tile
  const int64_t blocks = max_tiles * n_tiles_n;
  if (blocks == 0 || n_tiles_n == 0) return;
  unsigned vm = 0;
  if (vec_ok(a.a, a.lda, a.K)) vm |= 1u;
  if (a.K2 > 0 && vec_ok(a.a2, a.lda2, a.K2)) vm |= 4u;
  if (a.K2 > 0 && vec_ok(a.w2, a.ldw2, W2_KMAJ ? a.K2 : a.N) && a.w2_estride % 8 == 0) vm |= 8u;
  if (a.ldc % 2 == 0 && a.N % 2 == 0 && (reinterpret_cast<uintptr_t>(a.c) & 3u) == 0) vm |= 16u;
  if (packed_vec_ok(a.wq, W_KMAJ ? a.K : a.N)) vm |= 256u;  // the stored matrix's contiguous extent
  kern<<<dim3(static_cast<unsigned>(blocks)), kThreads, K_::SMEM_BYTES, stream>>>(a, n_tiles_n, vm);
}

template <class T, WeightFormat F, bool BLK_ROWS>
void dispatch_packed_tiles(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.N <= 32 && a.K2 == 0) {
    if (a.w_kmajor) launch_grouped_packed<T, 128, 16, 8, 1, true, true, F, BLK_ROWS>(a, stream);
    else launch_grouped_packed<T, 128, 16, 8, 1, false, false, F, BLK_ROWS>(a, stream);
    return;
  }
  // Without a LoRA term W2's orientation is free: take W2_KMAJ = true, whose variants do not spill on
  // sm_90a (ptxas -v: 0 bytes; the W2_KMAJ = false ones 56-76 bytes, as the dense kernels' 16-40).
  if (a.w_kmajor) {
    if (a.K2 == 0 || a.w2_kmajor) launch_grouped_packed<T, 128, 128, 2, 4, true, true, F, BLK_ROWS>(a, stream);
    else launch_grouped_packed<T, 128, 128, 2, 4, true, false, F, BLK_ROWS>(a, stream);
  } else {
    if (a.K2 > 0 && !a.w2_kmajor) launch_grouped_packed<T, 128, 128, 2, 4, false, false, F, BLK_ROWS>(a, stream);
    else launch_grouped_packed<T, 128, 128, 2, 4, false, true, F, BLK_ROWS>(a, stream);
  }
}

template <WeightFormat F>
void dispatch_grouped_packed(const GroupedGemmArgs& a, cudaStream_t stream) {
  auto by_dtype = [&](auto blk_rows) {
    constexpr bool kRows = decltype(blk_rows)::value;
    if (a.dtype == DType::bf16) dispatch_packed_tiles<__nv_bfloat16, F, kRows>(a, stream);
    else dispatch_packed_tiles<__half, F, kRows>(a, stream);
  };
  // nf4 pairs always run along the flat index: blocks_along_rows means nothing there.
  if constexpr (F == WeightFormat::nf4) by_dtype(std::false_type{});
  else if (a.wq.blocks_along_rows) by_dtype(std::true_type{});
  else by_dtype(std::false_type{});
}

}  // namespace ax::scattermoe::detail
