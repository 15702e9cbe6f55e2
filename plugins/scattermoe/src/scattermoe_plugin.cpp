// The scattermoe plugin: ATen glue between ax::ops::MoeExperts and the CUDA kernels in ../kernels.
//
// Forward (per projection, docs/plugins/scattermoe.md):
//   XA  = s · gather(X) · A_eᵀ                 [M, r]  thin grouped GEMM, saved for backward
//   Y   = gather(X) · W_e + XA · B_eᵀ + bias    one grouped GEMM: the LoRA term is two extra k-tiles
//   gates: Y_t = Σ_j g_tj · Y_(t,j)             a vector pass over the expert rows, which stay in sorted
//                                               order and are read through the inverse routing
//                                               permutation (gates.cu; no atomics, no zero-filled scatter)
// Backward (frozen base, g = gate of the entry or 1):
//   YB  = s · g · dY · B_e                     [M, r]
//   dX  = g · dY · W_eᵀ + YB · A_e              one grouped GEMM (LoRA fused as above); scattered input:
//                                               the k sorted rows of a token summed through the permutation
//   dA_e = YB_eᵀ · X_e,  dB_e = (g·dY)_eᵀ · XA_e  per-expert Gram products, deterministic (split path:
//                                               YB and dB from one pass over g·dY, kernels/lora_grad.cu)
// All routing stays on the device: no host synchronisation on the hot path (check_values off).
// Tile choice: every launch goes through tuner.hpp (tuning cache / heuristic / timing). Few large
// experts take the split path (split_path.cpp): base GEMMs by at::_grouped_mm, LoRA by our kernels.
// Both are set by the backend's options, [kernels.options.scattermoe] (options.hpp), which the engine
// binds with the run config and hands over before the first call.
// Quantised weights (nf4 / mxfp4 / nvfp4) are passed packed; the GEMMs decode them tile by tile inside
// their k loop (kernels/weight_formats.cuh): no dequantised copy, only routed experts' bytes are read.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <vector>

#include <axengine/ops/moe_mlp.hpp>
#include <axengine/plugin.hpp>

#include "glue.hpp"
#include "tuner.hpp"

namespace ax::scattermoe {
namespace {

using namespace glue;

// y[t] = Σ_j g[t, j] · rows[inv[t·k + j]] (gates undefined: weight 1, the k-sum of dX rows) into `out`
// ([T, N], when given; written directly when row-major). The expert rows are in sorted order; inv maps a
// scattered entry to its row (-1: inactive, contributes nothing).
at::Tensor combine_rows(const ops::MoeDims& d, int64_t N, const at::Tensor& rows, const at::Tensor& inv,
                        const at::Tensor& gates, const at::Tensor& out, cudaStream_t stream) {
  const bool into_out = out.defined() && out.stride(1) == 1;
  at::Tensor y = into_out ? out : at::empty({d.T, N}, rows.options());
  GatesArgs ga;
  ga.dtype = kernel_dtype(rows.scalar_type());
  ga.T = d.T;
  ga.k = static_cast<int>(d.k);
  ga.N = static_cast<int>(N);
  ga.rows = rows.data_ptr();
  ga.ld_rows = rows.stride(0);
  ga.row_of = inv.data_ptr<int64_t>();
  ga.gates = gates.defined() ? gates.data_ptr() : nullptr;
  ga.y = y.data_ptr();
  ga.ld_y = y.stride(0);
  if (launch_gates_combine(ga, stream)) {
    check_launch("gates combine");
  } else {
    const at::Tensor sc = scattered_rows(rows, inv).view({d.T, d.k, N});  // shapes the vector kernel skips
    y = gates.defined() ? at::bmm(gates.view({d.T, 1, d.k}), sc).view({d.T, N}) : sc.sum(1);
  }
  if (!out.defined() || y.is_same(out)) return y;
  out.copy_(y);  // a caller's output that is not row-major
  return out;
}

class ScatterMoe final : public ops::MoeExperts {
 public:
  explicit ScatterMoe(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}

 protected:
  ops::MoeExpertsResult run_forward(const ops::MoeExpertsArgs& args) override {
    check_supported(args);
    const auto d = ops::moe_dims(args);
    const at::Tensor x = rows(args.x);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const Routing rt = prepare(args, stream);
    const bool gated = args.gates.defined();
    const auto opts = x.options();
    // The expert outputs: in sorted order (gated: the combine reads them through the inverse
    // permutation, so only the rows a GEMM writes are ever read — no zero fill), or scattered when the
    // caller asked for that (zeroed first: rows of inactive entries are never written).
    const bool scattered_out = !gated && !args.grouped_out;
    const bool direct = !gated && args.out.defined() && args.out.stride(1) == 1;
    const bool split = choose_path(ctx_->path, args, d) == Path::split;
    at::Tensor y_rows, xa;
    if (!split || scattered_out || direct) {
      y_rows = direct ? args.out : at::empty({d.M, d.N}, opts);
      if (scattered_out) y_rows.zero_();
    }
    if (split) {
      SplitForward sf = split_forward(*ctx_, args, d, rt, x, y_rows, scattered_out, stream);
      y_rows = sf.y_rows;
      xa = sf.xa;
    } else {
      xa = fused_forward(ctx_->tuner, args, d, rt, x, y_rows, scattered_out, stream);
    }
    // A grouped output the caller sees: rows past the last expert are zero (seg[E] is on the device).
    if (!gated && !scattered_out) zero_tail(y_rows, d, rt, stream);
    return finish_forward(args, d, rt, x, y_rows, xa, direct);
  }

  // Fused forward: XA by the thin kernel, then Y = X W + XA Bᵀ + bias in one grouped GEMM.
  static at::Tensor fused_forward(Tuner& tuner, const ops::MoeExpertsArgs& args, const ops::MoeDims& d, const Routing& rt,
                                  const at::Tensor& x, at::Tensor& y_rows, bool scattered_out, cudaStream_t stream) {
    const DType dt = kernel_dtype(x.scalar_type());
    const WeightView w = weight_view(args);
    const bool lora = d.r > 0;
    GroupedGemmArgs g = routed(dt, d, rt);
    g.a = x.data_ptr();
    g.lda = x.stride(0);
    g.a_idx = args.grouped_in ? nullptr : rt.scattered.data_ptr<int64_t>();
    g.a_div = static_cast<int>(d.k);

    at::Tensor xa, lb;
    if (lora) {
      lb = rows(args.lora_b);
      xa = lora_xa(tuner, g, args, d, x, stream, "forward XA");
    }

    g.N = static_cast<int>(d.N);
    g.K = static_cast<int>(d.K);
    g.w = w.t.defined() ? w.t.data_ptr() : nullptr;
    g.w_kmajor = w.kmajor;
    g.ldw = w.ld;
    g.w_estride = w.estride;
    g.wq = w.packed;
    if (lora) {
      g.K2 = static_cast<int>(d.r);
      g.a2 = xa.data_ptr();
      g.lda2 = d.r;
      g.w2 = lb.data_ptr();  // B_e(j, n) = lora_b[n, e r + j]
      g.w2_kmajor = true;
      g.ldw2 = lb.stride(0);
      g.w2_estride = d.r;
    }
    at::Tensor bias;
    if (args.bias.defined()) {
      bias = args.bias.contiguous();
      g.bias = bias.data_ptr();
      g.bias_estride = bias.stride(0);
    }
    g.c = y_rows.data_ptr();
    g.ldc = y_rows.stride(0);
    g.c_idx = scattered_out ? rt.scattered.data_ptr<int64_t>() : nullptr;
    tuner.grouped(GemmOp::forward, d.r, g, stream);
    check_launch("forward GEMM");
    return xa;
  }

  // Gates combine and the result / saved tensors (both paths).
  static ops::MoeExpertsResult finish_forward(const ops::MoeExpertsArgs& args, const ops::MoeDims& d,
                                              const Routing& rt, const at::Tensor& x, const at::Tensor& y_rows,
                                              const at::Tensor& xa, bool direct) {
    const bool lora = d.r > 0;
    const bool gated = args.gates.defined();
    ops::MoeExpertsResult res;
    if (gated) {
      const at::Tensor gates = args.gates.to(x.scalar_type()).contiguous();
      cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
      res.y = combine_rows(d, d.N, y_rows, inverse_rows(rt, d.M, stream), gates, args.out, stream);
    } else if (args.out.defined() && !direct) {
      args.out.copy_(y_rows);
      res.y = args.out;
    } else {
      res.y = y_rows;
    }
    // saved: {XA or empty, expert rows in sorted order (gated only) or empty}
    res.saved = {lora ? xa : at::Tensor(), gated ? y_rows : at::Tensor()};
    return res;
  }

  ops::MoeExpertsGrads run_backward(const ops::MoeExpertsArgs& args, const ops::MoeExpertsBackwardArgs& bwd) override {
    check_supported(args);
    const auto d = ops::moe_dims(args);
    const at::Tensor x = rows(args.x);
    const DType dt = kernel_dtype(x.scalar_type());
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const Routing rt = prepare(args, stream);
    const WeightView w = weight_view(args);
    const bool lora = d.r > 0;
    const bool gated = args.gates.defined();
    const auto opts = x.options();
    const bool split = choose_path(ctx_->path, args, d) == Path::split;
    const at::Tensor gy = rows(bwd.grad_y);
    at::Tensor xa = bwd.saved.size() > 0 ? bwd.saved[0] : at::Tensor();
    at::Tensor y_rows = bwd.saved.size() > 1 ? bwd.saved[1] : at::Tensor();
    if (lora && !xa.defined()) throw RuntimeError("moe.experts[scattermoe]: backward needs the forward's saved XA");
    if (gated && bwd.need_dgates && !y_rows.defined())
      throw RuntimeError("moe.experts[scattermoe]: backward needs the forward's saved expert outputs");
    int64_t* scat = rt.scattered.data_ptr<int64_t>();
    at::Tensor gates_flat;
    if (gated) gates_flat = args.gates.to(x.scalar_type()).contiguous().view({-1});

    // How the kernels read dY for sorted row m: row scat[m]/k of [T, N] (gated), row m (grouped_out)
    // or row scat[m] (scattered output).
    const int64_t* dy_idx = gated ? scat : (args.grouped_out ? nullptr : scat);
    const int dy_div = gated ? static_cast<int>(d.k) : 1;

    GroupedGemmArgs base = routed(dt, d, rt);
    base.a = gy.data_ptr();
    base.lda = gy.stride(0);
    base.a_idx = dy_idx;
    base.a_div = dy_div;
    if (gated) {
      base.row_scale = gates_flat.data_ptr();
      base.rs_idx = scat;
    }

    const bool want_dlora = lora && bwd.need_dlora;
    // Split path: g · dY gathered into sorted order once; YB, dX and dB read it without gather or gate.
    at::Tensor dys;
    if (split && (bwd.need_dx || want_dlora)) {
      dys = split_sorted_grad(args, d, rt, gy, gates_flat, stream);
      base.a = dys.data_ptr();
      base.lda = dys.stride(0);
      base.a_idx = nullptr;
      base.a_div = 1;
      base.row_scale = nullptr;
      base.rs_idx = nullptr;
    }
    at::Tensor la, yb, db;
    // Split path with LoRA gradients: YB and dB from one read of dys (kernels/lora_grad.cu).
    bool yb_db_done = false;
    if (split && want_dlora) {
      yb = at::empty({d.M, d.r}, opts);
      db = at::empty({d.N, d.r * d.E}, opts);
      yb_db_done = split_lora_grads(args, d, rt, dys, xa, yb, db, stream);
    }
    const bool need_yb = lora && (bwd.need_dx || want_dlora);
    if (need_yb) la = rows(args.lora_a);
    if (need_yb && !yb_db_done) {
      if (!yb.defined()) yb = at::empty({d.M, d.r}, opts);
      const at::Tensor lb = rows(args.lora_b);
      GroupedGemmArgs t = base;  // YB = s · g · dY · B_e: B_e(n, j) = lora_b[n, e r + j]
      t.N = static_cast<int>(d.r);
      t.K = static_cast<int>(d.N);
      t.w = lb.data_ptr();
      t.w_kmajor = false;
      t.ldw = lb.stride(0);
      t.w_estride = d.r;
      t.alpha = static_cast<float>(args.scaling);
      t.c = yb.data_ptr();
      t.ldc = d.r;
      run_thin(ctx_->tuner, t, d.r, yb, stream, "backward YB");
    }

    // dX rows in sorted order: the caller's grouped dx (rows past the last expert zeroed), or summed over
    // each token's k entries through the inverse permutation (no zero-filled [M, K] scatter target).
    ops::MoeExpertsGrads grads;
    at::Tensor inv;
    if (bwd.need_dx) {
      at::Tensor dx_rows;
      if (split) {
        dx_rows = split_dx(*ctx_, args, d, rt, dys, yb, la, stream);
      } else {
        dx_rows = at::empty({d.M, d.K}, opts);
        GroupedGemmArgs t = base;  // dX = g · dY · W_eᵀ + YB · A_e
        t.N = static_cast<int>(d.K);
        t.K = static_cast<int>(d.N);
        t.w = w.t.defined() ? w.t.data_ptr() : nullptr;
        t.w_kmajor = !w.kmajor;
        t.ldw = w.ld;
        t.w_estride = w.estride;
        t.wq = w.packed;  // the same stored matrix, read transposed
        if (lora) {
          t.K2 = static_cast<int>(d.r);
          t.a2 = yb.data_ptr();
          t.lda2 = d.r;
          t.w2 = la.data_ptr();  // A_e(j, k) = lora_a[e r + j, k]
          t.w2_kmajor = false;
          t.ldw2 = la.stride(0);
          t.w2_estride = d.r * la.stride(0);
        }
        t.c = dx_rows.data_ptr();
        t.ldc = d.K;
        ctx_->tuner.grouped(GemmOp::dx, d.r, t, stream);
        check_launch("backward dX");
      }
      if (args.grouped_in) {
        zero_tail(dx_rows, d, rt, stream);
        grads.dx = assign(bwd.out.dx, dx_rows);
      } else {
        inv = inverse_rows(rt, d.M, stream);
        grads.dx = combine_rows(d, d.K, dx_rows, inv, at::Tensor(), bwd.out.dx, stream);
      }
    }

    if (want_dlora) {
      at::Tensor da = at::empty({d.r * d.E, d.K}, opts);
      if (!db.defined()) db = at::empty({d.N, d.r * d.E}, opts);
      GramArgs ga;  // dA_e[j, k] = Σ_m YB[m, j] · X[row(m), k]
      ga.dtype = dt;
      ga.E = static_cast<int>(d.E);
      ga.M = d.M;
      ga.seg = rt.seg();
      ga.row_expert = rt.expert.data_ptr<int64_t>();
      ga.I = static_cast<int>(d.K);
      ga.J = static_cast<int>(d.r);
      ga.p = x.data_ptr();
      ga.ldp = x.stride(0);
      ga.p_idx = args.grouped_in ? nullptr : scat;
      ga.p_div = static_cast<int>(d.k);
      ga.q = yb.data_ptr();
      ga.ldq = d.r;
      ga.c = da.data_ptr();
      ga.c_estride = d.r * d.K;
      ga.ldc_i = 1;
      ga.ldc_j = d.K;
      ctx_->tuner.gram(ga, stream);
      check_launch("backward dA");

      if (!yb_db_done) {
        at::Tensor xq = xa;  // dB_e[n, j] = Σ_m g_m dY[row(m), n] · XA[m, j]
        if (gated && !split) xq = xa * gates_flat.index_select(0, rt.scattered.clamp(0, d.M - 1)).unsqueeze(1);
        GramArgs gb = ga;
        gb.I = static_cast<int>(d.N);
        gb.p = split ? dys.data_ptr() : gy.data_ptr();  // split: g · dY already in sorted order
        gb.ldp = split ? dys.stride(0) : gy.stride(0);
        gb.p_idx = split ? nullptr : dy_idx;
        gb.p_div = split ? 1 : dy_div;
        gb.q = xq.data_ptr();
        gb.c = db.data_ptr();
        gb.c_estride = d.r;
        gb.ldc_i = d.r * d.E;
        gb.ldc_j = 1;
        ctx_->tuner.gram(gb, stream);
        check_launch("backward dB");
      }
      grads.dlora_a = assign(bwd.out.dlora_a, da);
      grads.dlora_b = assign(bwd.out.dlora_b, db);
    }

    if (gated && bwd.need_dgates) {  // dgates[t, j] = dY[t] · Y_(t,j), the rows in sorted order
      if (!inv.defined()) inv = inverse_rows(rt, d.M, stream);
      at::Tensor dg = at::empty({d.T, d.k}, opts);
      GatesArgs ga;
      ga.dtype = dt;
      ga.T = d.T;
      ga.k = static_cast<int>(d.k);
      ga.N = static_cast<int>(d.N);
      ga.rows = y_rows.data_ptr();
      ga.ld_rows = y_rows.stride(0);
      ga.row_of = inv.data_ptr<int64_t>();
      ga.gates = dg.data_ptr();
      ga.y = gy.data_ptr();
      ga.ld_y = gy.stride(0);
      if (launch_gates_grad(ga, stream)) check_launch("gates gradient");
      else dg = at::bmm(scattered_rows(y_rows, inv).view({d.T, d.k, d.N}), gy.view({d.T, d.N, 1})).view({d.T, d.k});
      grads.dgates = assign(bwd.out.dgates, dg.to(args.gates.scalar_type()));
    }
    return grads;
  }

 private:
  // Rows [seg[E], M) of a grouped [M, *] output (entries past the last expert must all be inactive).
  static void zero_tail(const at::Tensor& rows_out, const ops::MoeDims& d, const Routing& rt, cudaStream_t stream) {
    launch_zero_rows_from(rows_out.data_ptr(), rows_out.stride(0), rows_out.size(1), d.M, rt.seg() + d.E, stream);
    check_launch("zeroing rows past the last expert");
  }

  static at::Tensor assign(const at::Tensor& out, const at::Tensor& value) {
    if (!out.defined()) return value;
    out.copy_(value);
    return out;
  }

  static void check_supported(const ops::MoeExpertsArgs& args) {
    if (!args.x.is_cuda()) throw UsageError("moe.experts[scattermoe]: x: needs a CUDA tensor");
    kernel_dtype(args.x.scalar_type());
    const ops::WeightTensor& w = args.weight;
    if (w.is_dense()) {
      if (w.values.scalar_type() != args.x.scalar_type())
        throw UsageError("moe.experts[scattermoe]: weight: dtype must match x");
      return;
    }
    // Packed weights: what ops::validate admits, minus what the kernels do not decode.
    if (w.format == ops::WeightFormat::nf4) {
      if (w.blocksize < 16 || (w.blocksize & (w.blocksize - 1)) != 0)
        throw UsageError(str("moe.experts[scattermoe]: weight.blocksize: nf4 needs a power of two >= 16, got ",
                             w.blocksize));
      const int64_t nb = w.nested_blocksize;
      if (w.double_quant() && (nb <= 0 || (nb & (nb - 1)) != 0 || nb > (int64_t{1} << 30)))
        throw UsageError(str("moe.experts[scattermoe]: weight.nested_blocksize: must be a power of two, got ", nb));
    } else {
      const int64_t k_axis = args.layout == ops::ExpertLayout::EKN ? 1 : 2;
      const int64_t axis = w.axis < 0 ? w.axis + w.dim() : w.axis;
      if (axis != k_axis)
        throw UsageError(str("moe.experts[scattermoe]: weight.axis: ", ops::to_string(w.format),
                             " blocks must run along K (dim ", k_axis, " in layout ", ops::to_string(args.layout),
                             "), got axis ", w.axis));
    }
    for (int64_t d : w.shape)
      if (d > std::numeric_limits<int>::max())
        throw UsageError(str("moe.experts[scattermoe]: weight: ", w.describe(), " has a dimension past 2^31"));
  }

  std::shared_ptr<Context> ctx_;
};

}  // namespace
}  // namespace ax::scattermoe

// (Plain literals: a multi-line raw string inside a macro argument trips some preprocessors.)
// graph_safe: forward + backward capture into a CUDA graph and replay with new inputs and routing
// (tests/cuda/scattermoe_graph_test.cpp); the conformance suite's cuda_graph cases check it per problem.
AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"scattermoe\", \"version\": \"0.1.0\","
    " \"summary\": \"ScatterMoE-style grouped expert GEMMs with fused LoRA (CUDA, mma.sync tensor cores)\","
    " \"providers\": [{\"kind\": \"kernel\", \"op\": \"moe.experts\", \"name\": \"scattermoe\", \"graph_safe\": true,"
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"bf16\", \"fp16\"],"
    " \"formats\": [\"dense\", \"nf4\", \"mxfp4\", \"nvfp4\"], \"layouts\": [\"EKN\", \"ENK\"]}},"
    // moe.mlp: the whole block composed from the same kernels (ax::ops::compose_moe_mlp), so it runs wherever
    // moe.experts does and is the fallback of a faster whole-block backend on every GPU the latter skips.
    " {\"kind\": \"kernel\", \"op\": \"moe.mlp\", \"name\": \"scattermoe\", \"graph_safe\": true,"
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_80\", \"dtypes\": [\"bf16\", \"fp16\"],"
    " \"formats\": [\"dense\", \"nf4\", \"mxfp4\", \"nvfp4\"], \"layouts\": [\"EKN\", \"ENK\"]}}]}")

AXENGINE_PLUGIN_REGISTER(reg) {
  using namespace ax::scattermoe;
  auto ctx = std::make_shared<glue::Context>();
  reg.backend_options<Options>("scattermoe", "options of the scattermoe moe.experts backend; docs/plugins/scattermoe.md, section Options",
                               bind_options, [ctx](const Options& o) { ctx->configure(o); });
  auto experts = std::make_shared<ScatterMoe>(ctx);
  reg.kernel<ax::ops::MoeExperts>("scattermoe", experts);
  reg.kernel<ax::ops::MoeMlp>("scattermoe", ax::ops::compose_moe_mlp(experts));
}
