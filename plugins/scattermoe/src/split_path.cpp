// The split path of the scattermoe glue (glue.hpp), for few large experts (Mixtral-like):
//   forward:  Xs = gather(X) in sorted order;  XA = s · Xs · A_eᵀ (thin kernel);
//             sm_90: Y = Xs · W_e + XA · B_eᵀ + bias in one pass (kernels/wgmma_gemm.cu: TMA + wgmma, the
//             LoRA product as one extra K tile);
//             sm_100, or calls that kernel does not take: base = _grouped_mm(Xs, W, offsets) (CUTLASS),
//             then Y = XA · B_eᵀ + bias + base (our LoRA-add pass, kernels/lora_add.cu, in place in base).
//   backward: dYs = g · gather(dY);  dX = dYs · W_eᵀ + YB · A_e, by the same two routes.
// Rows stay in sorted order. Our mma.sync kernel reaches about half of wgmma's throughput on these big
// GEMMs, hence the path. at::_grouped_mm only has its fast kernel on sm_90 / sm_100 and bf16 (elsewhere it
// falls back to a per-expert loop that reads the offsets back to the host), and needs 16-byte aligned rows:
// the path is offered only then.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include <axengine/log.hpp>

#include "glue.hpp"
#include "tuner.hpp"

namespace ax::scattermoe::glue {
namespace {

bool aligned16(const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15u) == 0; }

// The weight as _grouped_mm's mat_b: logical [E, K, N], one of the last two dims contiguous, the other
// stride and the expert stride multiples of 8 elements (16-byte aligned group bases), base aligned.
at::Tensor gmm_weight(const ops::MoeExpertsArgs& args) {
  const at::Tensor& v = args.weight.values;
  return args.layout == ops::ExpertLayout::EKN ? v : v.transpose(1, 2);
}
bool gmm_weight_ok(const at::Tensor& w) {
  const bool inner = (w.stride(2) == 1 && w.stride(1) % 8 == 0 && w.stride(1) >= w.size(2)) ||
                     (w.stride(1) == 1 && w.stride(2) % 8 == 0 && w.stride(2) >= w.size(1));
  return inner && w.stride(0) % 8 == 0 && aligned16(w);
}

// A row-major operand _grouped_mm accepts (16-byte aligned base and row stride), copying when needed.
at::Tensor gmm_rows(const at::Tensor& t) {
  if (t.stride(1) == 1 && t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) && aligned16(t)) return t;
  return t.clone(at::MemoryFormat::Contiguous);
}

// Sorted row -> source row of a [T or M, *] tensor, with inactive entries (garbage scattered index)
// pointing at row 0: their results are never used (the epilogue skips inactive rows).
at::Tensor safe_rows(const Routing& rt, int64_t div) {
  at::Tensor src = div == 1 ? rt.scattered : rt.scattered.div(div, "floor");
  return at::where(rt.expert >= 0, src, at::zeros({}, src.options()));
}

bool split_available(const ops::MoeExpertsArgs& args, const ops::MoeDims& d, std::string& why) {
  if (args.x.scalar_type() != at::kBFloat16) return why = "needs bf16", false;
  if (!args.weight.is_dense()) return why = "needs a dense weight", false;
  if (d.K % 8 != 0 || d.N % 8 != 0) return why = "needs K and N multiples of 8", false;
  if (d.M >= (int64_t{1} << 31)) return why = "needs M < 2^31 (int32 offsets)", false;
  if (!gmm_weight_ok(gmm_weight(args))) return why = "needs 16-byte aligned weight strides", false;
  int dev = args.x.device().index(), major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return why = "cannot read the compute capability", false;
  }
  if (major != 9 && major != 10) return why = "at::_grouped_mm has a fast kernel on sm_90 / sm_100 only", false;
  return true;
}

// Offsets for _grouped_mm: int32 cumulative ends, on the device (no host synchronisation).
at::Tensor gmm_offsets(const Routing& rt) { return rt.offsets.to(at::kInt); }

// One projection of the split path by kernels/wgmma_gemm.cu, where it runs (sm_90; the stored weight
// [E, R, C] with C contiguous and experts R·C apart; rank a multiple of 8 up to 64): the rows in sorted
// order, written to `target` or (undefined) a new [M, cols] tensor. `transposed` reads the weight as the
// backward does (no bias then). Returns an undefined tensor, launching nothing, where it does not run.
at::Tensor wgmma_projection(PathMode mode, const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                            const at::Tensor& a, bool transposed, const at::Tensor& a2, const at::Tensor& w2,
                            const at::Tensor& target, cudaStream_t stream) {
  if (mode == PathMode::split_gmm || !wgmma_gemm_available(a.device().index())) return {};
  const at::Tensor& v = args.weight.values;
  if (v.dim() != 3 || v.stride(2) != 1 || v.stride(0) != v.size(1) * v.stride(1)) return {};
  if (a.stride(1) != 1 || (a2.defined() && !a2.is_contiguous()) || (target.defined() && target.stride(1) != 1))
    return {};
  const at::Tensor out = target.defined() ? target : at::empty({d.M, transposed ? d.K : d.N}, a.options());
  const at::Tensor bias = !transposed && args.bias.defined() ? args.bias.contiguous() : at::Tensor();
  WgmmaGemmArgs g;
  g.E = static_cast<int>(d.E);
  g.M = d.M;
  g.N = static_cast<int>(transposed ? d.K : d.N);
  g.K = static_cast<int>(transposed ? d.N : d.K);
  g.r = a2.defined() ? static_cast<int>(d.r) : 0;
  g.seg = rt.seg();
  g.row_expert = rt.expert.data_ptr<int64_t>();
  g.a = a.data_ptr();
  g.lda = a.stride(0);
  g.w = v.data_ptr();
  g.ldw = v.stride(1);
  // ENK stores W_e as [N, K] (K-major for the forward); EKN as [K, N]; the backward reads the other way.
  g.w_kmajor = (args.layout == ops::ExpertLayout::ENK) != transposed;
  if (g.r > 0) {
    g.a2 = a2.data_ptr();
    g.w2 = w2.data_ptr();
    g.ldw2 = w2.stride(0);
    g.w2_kmajor = !transposed;  // forward: lora_b [N, r·E]; backward: lora_a [r·E, K]
  }
  if (bias.defined()) {
    g.bias = bias.data_ptr();
    g.bias_estride = bias.stride(0);
  }
  g.out = out.data_ptr();
  g.ldo = out.stride(0);
  if (!launch_wgmma_gemm(g, stream)) return {};
  check_launch(transposed ? "split backward dX (wgmma)" : "split forward (wgmma)");
  return out;
}

}  // namespace

Path choose_path(PathMode mode, const ops::MoeExpertsArgs& args, const ops::MoeDims& d) {
  if (mode == PathMode::fused) return Path::fused;
  std::string why;
  const bool ok = split_available(args, d, why);
  if (mode == PathMode::split || mode == PathMode::split_gmm) {
    if (!ok) {
      static std::once_flag once;
      std::call_once(once, [&] {
        ax::log::warn(str("scattermoe: option path = \"split\": not available here (", why,
                          "); using the fused path"));
      });
    }
    return ok ? Path::split : Path::fused;
  }
  // Automatic: the base GEMMs dominate once experts hold a hundred rows or more, and there CUTLASS's
  // wgmma beats our mma.sync by ~2x. Measured on H200 (bench/results/moe-nvidia-h200-*.json, block
  // fwd+bwd, split vs fused): 128 rows/expert (qwen3.5-35b-a3b: 3.08 vs 3.64 ms), 256 (qwen3-30b-a3b:
  // 3.11 vs 4.42), 512 (olmoe: 3.50 vs 5.23), 1024 (mixtral: 14.8 vs 27.0, before the LoRA-add rework).
  // Below 128 rows per expert the fused single pass (no gather copy, no [M, N] base buffer) is kept:
  // not measured there.
  const int64_t rows_per_expert = d.E > 0 ? d.M / d.E : 0;
  return ok && rows_per_expert >= 128 && d.N * d.K >= (int64_t{1} << 20) ? Path::split : Path::fused;
}

SplitForward split_forward(Context& ctx, const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                           const at::Tensor& x, const at::Tensor& target, bool scattered_out, cudaStream_t stream) {
  const bool lora = d.r > 0;
  at::Tensor base, xa, lb;
  {
    // Xs: X rows in sorted order (the same gather the _grouped_mm block does), freed after use.
    const at::Tensor xs = args.grouped_in ? gmm_rows(x) : x.index_select(0, safe_rows(rt, d.k));
    if (lora) {
      GroupedGemmArgs t = routed(DType::bf16, d, rt);  // XA = s · Xs · A_eᵀ
      t.a = xs.data_ptr();
      t.lda = xs.stride(0);
      xa = lora_xa(ctx.tuner, t, args, d, x, stream, "split forward XA");
    }
    if (!scattered_out) {  // the whole projection in one kernel where it runs
      at::Tensor y = wgmma_projection(ctx.path, args, d, rt, xs, false, xa, lora ? rows(args.lora_b) : at::Tensor(), target, stream);
      if (y.defined()) return {y, xa};
    }
    base = at::_grouped_mm(xs, gmm_weight(args), gmm_offsets(rt));
  }
  GroupedGemmArgs g = routed(DType::bf16, d, rt);  // Y = XA · B_eᵀ + bias + base, scattered like the fused path
  g.N = static_cast<int>(d.N);
  if (lora) {
    lb = rows(args.lora_b);
    g.K = static_cast<int>(d.r);
    g.a = xa.data_ptr();
    g.lda = d.r;
    g.w = lb.data_ptr();  // B_e(j, n) = lora_b[n, e r + j]
    g.w_kmajor = true;
    g.ldw = lb.stride(0);
    g.w_estride = d.r;
  } else {
    g.K = 0;  // output = base (+ bias), scattered
    g.a = base.data_ptr();
    g.lda = base.stride(0);
    g.w = base.data_ptr();
  }
  at::Tensor bias;
  if (args.bias.defined()) {
    bias = args.bias.contiguous();
    g.bias = bias.data_ptr();
    g.bias_estride = bias.stride(0);
  }
  // In place (no target): each output element is read as addend and written by the same thread, and
  // rows map to themselves (no scatter), so there is no race.
  const at::Tensor y_rows = target.defined() ? target : base;
  g.d = base.data_ptr();
  g.ldd = base.stride(0);
  g.beta = 1.f;
  g.c = y_rows.data_ptr();
  g.ldc = y_rows.stride(0);
  g.c_idx = scattered_out ? rt.scattered.data_ptr<int64_t>() : nullptr;
  if (!target.defined() && scattered_out) throw RuntimeError("scattermoe: split forward: scattered output needs a target");
  ctx.tuner.grouped(GemmOp::lora_add, d.r, g, stream);
  check_launch("split forward LoRA + base");
  return {y_rows, xa};
}

at::Tensor split_sorted_grad(const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                             const at::Tensor& gy, const at::Tensor& gates_flat, cudaStream_t stream) {
  if (args.grouped_out && !args.gates.defined()) return gmm_rows(gy);
  // Gated: row t of [T, N] for entry s = t·k + j, times the entry's gate; scattered output: row s.
  const bool gated = args.gates.defined();
  at::Tensor dys = at::empty({d.M, d.N}, gy.options());
  GatherArgs ga;
  ga.dtype = kernel_dtype(gy.scalar_type());
  ga.M = d.M;
  ga.N = static_cast<int>(d.N);
  ga.row_expert = rt.expert.data_ptr<int64_t>();
  ga.idx = rt.scattered.data_ptr<int64_t>();
  ga.div = gated ? static_cast<int>(d.k) : 1;
  ga.src = gy.data_ptr();
  ga.ld_src = gy.stride(0);
  ga.scale = gated ? gates_flat.data_ptr() : nullptr;
  ga.out = dys.data_ptr();
  ga.ld_out = dys.stride(0);
  if (launch_gather_rows(ga, stream)) {
    check_launch("split backward g · dY gather");
    return dys;
  }
  if (!gated) return gy.index_select(0, safe_rows(rt, 1));
  at::Tensor g = gates_flat.index_select(0, safe_rows(rt, 1)).unsqueeze(1);
  return gy.index_select(0, safe_rows(rt, d.k)).mul_(g);
}

at::Tensor split_dx(Context& ctx, const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                    const at::Tensor& dys, const at::Tensor& yb, const at::Tensor& la, cudaStream_t stream) {
  if (at::Tensor dx = wgmma_projection(ctx.path, args, d, rt, dys, true, d.r > 0 ? yb : at::Tensor(), la, {}, stream); dx.defined())
    return dx;
  const at::Tensor dxb = at::_grouped_mm(dys, gmm_weight(args).transpose(1, 2), gmm_offsets(rt));  // [M, K]
  GroupedGemmArgs t = routed(DType::bf16, d, rt);  // dX = YB · A_e + dXb: A_e(j, k) = lora_a[e r + j, k]
  t.N = static_cast<int>(d.K);
  if (d.r > 0) {
    t.K = static_cast<int>(d.r);
    t.a = yb.data_ptr();
    t.lda = d.r;
    t.w = la.data_ptr();
    t.w_kmajor = false;
    t.ldw = la.stride(0);
    t.w_estride = d.r * la.stride(0);
  } else {
    t.K = 0;
    t.a = dxb.data_ptr();
    t.lda = dxb.stride(0);
    t.w = dxb.data_ptr();
  }
  // In place in dXb (same-thread read then write, rows unmoved; see split_forward).
  t.d = dxb.data_ptr();
  t.ldd = dxb.stride(0);
  t.c = dxb.data_ptr();
  t.ldc = dxb.stride(0);
  ctx.tuner.grouped(GemmOp::lora_add, d.r, t, stream);
  check_launch("split backward dX");
  return dxb;
}

bool split_lora_grads(const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt, const at::Tensor& dys,
                      const at::Tensor& xa, const at::Tensor& yb, const at::Tensor& db, cudaStream_t stream) {
  if (!xa.is_contiguous() || xa.size(1) != d.r || !yb.is_contiguous() || db.stride(1) != 1) return false;
  const int sms = at::cuda::getDeviceProperties(dys.device().index())->multiProcessorCount;
  const LoraGradPlan plan = lora_grad_plan(d.M, static_cast<int>(d.N), static_cast<int>(d.r), static_cast<int>(d.E), sms);
  if (plan.chunks == 0) return false;
  const at::Tensor lb = rows(args.lora_b);
  const at::Tensor ws = at::empty({plan.workspace_floats}, dys.options().dtype(at::kFloat));
  LoraGradArgs a;
  a.dtype = kernel_dtype(dys.scalar_type());
  a.E = static_cast<int>(d.E);
  a.N = static_cast<int>(d.N);
  a.r = static_cast<int>(d.r);
  a.M = d.M;
  a.seg = rt.seg();
  a.row_expert = rt.expert.data_ptr<int64_t>();
  a.g = dys.data_ptr();
  a.ldg = dys.stride(0);
  a.b = lb.data_ptr();
  a.ldb = lb.stride(0);
  a.xa = xa.data_ptr();
  a.alpha = static_cast<float>(args.scaling);
  a.yb = yb.data_ptr();
  a.db = db.data_ptr();
  a.lddb = db.stride(0);
  a.workspace = ws.data_ptr<float>();
  if (!launch_lora_grad(a, plan, stream)) return false;
  check_launch("split backward YB and dB");
  return true;
}

}  // namespace ax::scattermoe::glue
