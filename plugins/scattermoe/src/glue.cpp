// Shared pieces of the glue (glue.hpp): an expert weight (dense, or packed nf4 / mxfp4 / nvfp4) as the
// kernels address it, the routing fields of a launch, the XA product.
#include "glue.hpp"

#include <ATen/cuda/CUDAContext.h>

#include "tuner.hpp"

namespace ax::scattermoe::glue {
namespace {

using ops::ExpertLayout;

// Packed tensors as the kernels address them: row-major without gaps (a copy only when the caller's
// tensor is a strided view; the format's shapes were validated by ops::validate).
const void* packed_ptr(WeightView& v, const at::Tensor& t) {
  v.keep.push_back(t.contiguous());
  return v.keep.back().data_ptr();
}

WeightView packed_view(const ops::MoeExpertsArgs& args) {
  const ops::WeightTensor& w = args.weight;
  WeightView v;
  v.kmajor = args.layout == ExpertLayout::ENK;
  PackedWeight& p = v.packed;
  p.codes = static_cast<const uint8_t*>(packed_ptr(v, w.codes));
  p.scales = packed_ptr(v, w.scales);
  p.blocksize = static_cast<int>(w.blocksize);
  switch (w.format) {
    case ops::WeightFormat::nf4:
      p.format = WeightFormat::nf4;
      if (w.double_quant()) {
        p.nested_code = static_cast<const float*>(packed_ptr(v, w.nested_code));
        p.nested_scales = static_cast<const float*>(packed_ptr(v, w.nested_scales));
        p.nested_offset = static_cast<float>(w.nested_offset);
        p.nested_blocksize = static_cast<int>(w.nested_blocksize);
      }
      break;
    case ops::WeightFormat::mxfp4:
    case ops::WeightFormat::nvfp4:
      p.format = w.format == ops::WeightFormat::mxfp4 ? WeightFormat::mxfp4 : WeightFormat::nvfp4;
      p.blocks_along_rows = args.layout == ExpertLayout::EKN;  // K is dim 1 of [E, K, N], dim 2 of [E, N, K]
      if (w.format == ops::WeightFormat::nvfp4) {
        p.global_scale = static_cast<const float*>(packed_ptr(v, w.global_scale));
        p.global_per_expert = w.global_scale.numel() > 1;
      }
      break;
    case ops::WeightFormat::dense:
      throw RuntimeError("moe.experts[scattermoe]: packed_view called on a dense weight");
  }
  return v;
}

}  // namespace

WeightView weight_view(const ops::MoeExpertsArgs& args) {
  if (!args.weight.is_dense()) return packed_view(args);
  at::Tensor w = args.weight.values;
  // Logical dims of the stored tensor: EKN [E, K, N] or ENK [E, N, K].
  const bool enk = args.layout == ExpertLayout::ENK;
  // Accept either inner dimension contiguous (a transposed view is just the other layout).
  if (w.stride(2) != 1 && w.stride(1) != 1) w = w.contiguous();
  WeightView v;
  v.t = w;
  v.estride = w.stride(0);
  if (w.stride(2) == 1) {
    v.kmajor = enk;  // innermost is K for ENK, N for EKN
    v.ld = w.stride(1);
  } else {
    v.kmajor = !enk;
    v.ld = w.stride(2);
  }
  return v;
}

GroupedGemmArgs routed(DType dtype, const ops::MoeDims& d, const Routing& rt) {
  GroupedGemmArgs g;
  g.dtype = dtype;
  g.E = static_cast<int>(d.E);
  g.M = d.M;
  g.seg = rt.seg();
  g.tile_start = rt.tiles();
  g.row_expert = rt.expert.data_ptr<int64_t>();
  return g;
}

at::Tensor inverse_rows(const Routing& rt, int64_t M, cudaStream_t stream) {
  at::Tensor inv = at::empty({M}, rt.scattered.options());
  launch_inverse_rows(rt.expert.data_ptr<int64_t>(), rt.scattered.data_ptr<int64_t>(), M, inv.data_ptr<int64_t>(),
                      stream);
  check_launch("inverse routing permutation");
  return inv;
}

at::Tensor scattered_rows(const at::Tensor& rows, const at::Tensor& inv) {
  // masked_fill rather than a multiply: rows no GEMM wrote may hold NaN.
  return rows.index_select(0, inv.clamp_min(0)).masked_fill_((inv < 0).unsqueeze(1), 0);
}

at::Tensor lora_xa(Tuner& tuner, const GroupedGemmArgs& g, const ops::MoeExpertsArgs& args, const ops::MoeDims& d,
                   const at::Tensor& opts_like, cudaStream_t stream, const char* what) {
  const at::Tensor la = rows(args.lora_a);
  at::Tensor xa = at::empty({d.M, d.r}, opts_like.options());
  GroupedGemmArgs t = g;
  t.N = static_cast<int>(d.r);
  t.K = static_cast<int>(d.K);
  t.w = la.data_ptr();
  t.w_kmajor = true;
  t.ldw = la.stride(0);
  t.w_estride = d.r * la.stride(0);
  t.alpha = static_cast<float>(args.scaling);
  t.c = xa.data_ptr();
  t.ldc = d.r;
  run_thin(tuner, t, d.r, opts_like, stream, what);
  return xa;
}

void run_thin(Tuner& tuner, GroupedGemmArgs t, int64_t rank, const at::Tensor& like, cudaStream_t stream, const char* what) {
  t.splits = thin_split_k(t, at::cuda::getDeviceProperties(like.device().index())->multiProcessorCount);
  at::Tensor ws;
  if (t.splits > 1) {
    ws = at::empty({t.splits, t.M, t.N}, like.options().dtype(at::kFloat));
    t.partial = ws.data_ptr<float>();
  }
  tuner.grouped(GemmOp::thin, rank, t, stream);
  check_launch(what);
}

}  // namespace ax::scattermoe::glue
