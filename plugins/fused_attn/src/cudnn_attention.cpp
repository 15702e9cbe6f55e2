// attention through cuDNN's fused flash attention (the cudnn_frontend graph API over the libcudnn that
// LibTorch ships), in its ragged "THD" form: the packed [T, H, D] rows of every sequence are described to
// cuDNN as a nominal [B, H, S, D] tensor whose batch b starts at a ragged offset cu_seqlens[b] · token
// stride, with per-sequence lengths masking the padding. Why cuDNN and not LibTorch's FlashAttention-2
// (the `aten` backend): on the H200 it is 1.4–1.8× faster at the bench shapes
// (bench/results/attention-efficiency-nvidia-h200-2026-11-24.json), and its backward has a deterministic
// algorithm (the contract wants bitwise-reproducible dq/dk/dv) where flash's is made deterministic by a
// process-wide flag.
//
// Graphs are built once per shape class and cached: the class is (dtype, padded batch, heads, head dims,
// seqlen bucket, strides, scale, causal). To keep it small under packing, where every batch has its own
// number of sequences and longest sequence, the batch is padded to a power of two with empty sequences
// and the longest sequence rounded up to a power of two (cuDNN masks by the real lengths; the nominal
// bound only sizes the grid, whose tiles past a sequence's end exit at once).
//
// GQA is native (k/v keep their Hkv heads). The lse comes out token-major ([T, Hq] fp32) and is handed on
// as the contract's [Hq, T] view of it; backward gives it back to cuDNN in that same storage.
//
// What this backend declines (`unfit`), the next backend of the preference list serves: sinks (it does
// not claim the layout), sliding windows, separate key boundaries (cu_seqlens_k), head dims that are not
// multiples of 8 or above 128, pre-sm_90.
// (The frontend admits up to 256 on sm_90, MLA's qk 192 / v 128 among them, but these graphs have not been
// run at such dims: until the conformance suite has certified them on a GPU, `aten` takes them.)
#include "cudnn_attention.hpp"


#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <cudnn_frontend.h>

#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include <axengine/strings.hpp>

namespace ax::fused_attn {
namespace {

namespace fe = cudnn_frontend;

// Tensor ids of the graphs' variant packs.
enum Uid : int64_t {
  Q = 1, K, V, O, STATS, DO, DQ, DK, DV, SEQ_Q, SEQ_KV,
  OFF_Q, OFF_K, OFF_V, OFF_O, OFF_STATS, OFF_DQ, OFF_DK, OFF_DV  // ragged offsets, in elements
};

// How much larger than the tokens the nominal [B, S] grid may be before the call is declined (below).
// (Small grids cost nothing either way: below kMinNominalToDecline rows cuDNN keeps every call.)
constexpr int64_t kMaxNominalOverTokens = 8, kMinNominalToDecline = 65536;

int64_t pow2_at_least(int64_t n, int64_t floor) {
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max(n, floor))));
}

// A call's shape class: everything a cuDNN graph bakes in.
struct Shape {
  bool backward = false, causal = true, bf16 = true;
  int64_t B = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0, S = 0;
  int64_t q_tok = 0, q_head = 0, k_tok = 0, k_head = 0, v_tok = 0, v_head = 0;
  float scale = 0;
  auto tie() const {
    return std::tie(backward, causal, bf16, B, Hq, Hkv, D, Dv, S, q_tok, q_head, k_tok, k_head, v_tok, v_head, scale);
  }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

fe::DataType_t io_type(const Shape& s) { return s.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr index_tensor(fe::graph::Graph& g, Uid uid, const char* name, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes().set_uid(uid).set_name(name).set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::INT32));
}

// A packed [T, H, d] operand as cuDNN's nominal [B, H, S, d] with a ragged batch offset. The batch stride
// is never used (the offsets place each sequence) but must be a multiple of the 16-byte alignment: the
// nominal dense one.
TensorPtr thd_tensor(fe::graph::Graph& g, Uid uid, const char* name, const Shape& s, int64_t H, int64_t d,
                     int64_t tok, int64_t head, const TensorPtr& offset) {
  auto t = g.tensor(fe::graph::Tensor_attributes().set_uid(uid).set_name(name).set_dim({s.B, H, s.S, d})
                        .set_stride({s.S * tok, head, tok, 1}).set_data_type(io_type(s)));
  t->set_ragged_offset(offset);
  return t;
}

// Outputs are described the same way (set on the tensor the sdpa node returned).
void as_thd(const TensorPtr& t, Uid uid, const Shape& s, int64_t H, int64_t d, const TensorPtr& offset,
            fe::DataType_t type) {
  t->set_uid(uid).set_output(true).set_dim({s.B, H, s.S, d}).set_stride({s.S * H * d, d, H * d, 1}).set_data_type(type);
  t->set_ragged_offset(offset);
}

void check(fe::error_t e, const char* what) {
  if (!e.is_good()) throw std::runtime_error(str("attention[fused_attn]: cuDNN ", what, ": ", e.get_message()));
}

std::unique_ptr<fe::graph::Graph> build(const Shape& s, cudnnHandle_t handle) {
  auto g = std::make_unique<fe::graph::Graph>();
  g->set_io_data_type(io_type(s)).set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto seq_q = index_tensor(*g, SEQ_Q, "seq_q", s.B);
  auto seq_kv = index_tensor(*g, SEQ_KV, "seq_kv", s.B);
  auto off_q = index_tensor(*g, OFF_Q, "off_q", s.B + 1);
  auto off_k = index_tensor(*g, OFF_K, "off_k", s.B + 1);
  auto off_v = index_tensor(*g, OFF_V, "off_v", s.B + 1);
  auto off_o = index_tensor(*g, OFF_O, "off_o", s.B + 1);
  auto off_stats = index_tensor(*g, OFF_STATS, "off_stats", s.B + 1);
  auto q = thd_tensor(*g, Q, "q", s, s.Hq, s.D, s.q_tok, s.q_head, off_q);
  auto k = thd_tensor(*g, K, "k", s, s.Hkv, s.D, s.k_tok, s.k_head, off_k);
  auto v = thd_tensor(*g, V, "v", s, s.Hkv, s.Dv, s.v_tok, s.v_head, off_v);
  if (!s.backward) {
    auto opt = fe::graph::SDPA_attributes().set_name("fwd").set_generate_stats(true).set_attn_scale(s.scale)
                   .set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    if (s.causal) opt.set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, k, v, opt);
    as_thd(o, O, s, s.Hq, s.Dv, off_o, io_type(s));
    as_thd(stats, STATS, s, s.Hq, 1, off_stats, fe::DataType_t::FLOAT);
  } else {
    auto o = thd_tensor(*g, O, "o", s, s.Hq, s.Dv, s.Hq * s.Dv, s.Dv, off_o);
    auto dout = thd_tensor(*g, DO, "do", s, s.Hq, s.Dv, s.Hq * s.Dv, s.Dv, off_o);
    auto stats = g->tensor(fe::graph::Tensor_attributes().set_uid(STATS).set_name("stats").set_dim({s.B, s.Hq, s.S, 1})
                               .set_stride({s.S * s.Hq, 1, s.Hq, 1}).set_data_type(fe::DataType_t::FLOAT));
    stats->set_ragged_offset(off_stats);
    auto opt = fe::graph::SDPA_backward_attributes().set_name("bwd").set_attn_scale(s.scale).set_padding_mask(true)
                   .set_seq_len_q(seq_q).set_seq_len_kv(seq_kv).set_deterministic_algorithm(true);
    if (s.causal) opt.set_causal_mask(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opt);
    // The gradients are dense [T, H, d] whatever the inputs' strides: offsets of their own.
    as_thd(dq, DQ, s, s.Hq, s.D, index_tensor(*g, OFF_DQ, "off_dq", s.B + 1), io_type(s));
    as_thd(dk, DK, s, s.Hkv, s.D, index_tensor(*g, OFF_DK, "off_dk", s.B + 1), io_type(s));
    as_thd(dv, DV, s, s.Hkv, s.Dv, index_tensor(*g, OFF_DV, "off_dv", s.B + 1), io_type(s));
  }
  check(g->validate(), "graph validation");
  check(g->build_operation_graph(handle), "operation graph");
  check(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans");
  check(g->check_support(handle), "support check");
  check(g->build_plans(handle), "plan build");
  return g;
}

// Built graphs, per device (plans are device-specific); built under the lock, executed outside it.
fe::graph::Graph& graph_for(const Shape& s, cudnnHandle_t handle) {
  static std::mutex mutex;
  static std::map<std::pair<int, Shape>, std::unique_ptr<fe::graph::Graph>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{at::cuda::current_device(), s}];
  if (!slot) slot = build(s, handle);
  return *slot;
}

// The ragged bookkeeping of one call: lengths and element offsets of the padded batch, on the device.
struct Ragged {
  at::Tensor seqlens;  // int32 [B]
  at::Tensor cu;       // int32 [B + 1]
  std::map<int64_t, at::Tensor> offsets;  // by token stride: cu · stride
  int64_t T = 0;
  const at::Tensor& offset(int64_t stride) {
    // cuDNN takes the offsets as int32 elements.
    if (T * stride > INT_MAX)
      throw std::runtime_error(str("attention[fused_attn]: ", T, " tokens of ", stride,
                                   " elements overflow cuDNN's int32 ragged offsets"));
    auto& t = offsets[stride];
    if (!t.defined()) t = stride == 1 ? cu : cu * static_cast<int>(stride);
    return t;
  }
};

// cu_seqlens padded with empty sequences to B sequences (B + 1 entries).
Ragged ragged(const at::Tensor& cu_seqlens, int64_t B, int64_t T) {
  at::Tensor cu = cu_seqlens.to(at::kInt);
  const int64_t real = cu.numel() - 1;
  if (B > real) cu = at::cat({cu, cu.narrow(0, real, 1).expand({B - real})});
  Ragged r;
  r.T = T;
  r.cu = cu.contiguous();
  r.seqlens = (r.cu.narrow(0, 1, B) - r.cu.narrow(0, 0, B)).contiguous();
  return r;
}

// cuDNN reads rows through 16-byte vectors: dense last dim, strides multiples of 8 elements, aligned base.
at::Tensor cudnn_layout(const at::Tensor& t) {
  const bool ok = t.stride(2) == 1 && t.stride(1) % 8 == 0 && t.stride(0) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? t : t.contiguous();
}

Shape shape_of(const ops::AttentionArgs& a, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               bool backward) {
  Shape s;
  s.backward = backward;
  s.causal = a.causal;
  s.bf16 = q.scalar_type() == at::kBFloat16;
  s.B = pow2_at_least(a.cu_seqlens.numel() - 1, 1);
  s.Hq = q.size(1);
  s.Hkv = k.size(1);
  s.D = q.size(2);
  s.Dv = v.size(2);
  s.S = pow2_at_least(a.max_seqlen, 64);
  s.q_tok = q.stride(0), s.q_head = q.stride(1);
  s.k_tok = k.stride(0), s.k_head = k.stride(1);
  s.v_tok = v.stride(0), s.v_head = v.stride(1);
  s.scale = static_cast<float>(a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(s.D)));
  return s;
}

void run(fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, const at::Tensor& like) {
  cudnnHandle_t handle = at::native::getCudnnHandle();  // bound to the current stream
  at::Tensor workspace = at::empty({std::max<int64_t>(g.get_workspace_size(), 1)}, like.options().dtype(at::kByte));
  check(g.execute(handle, pack, workspace.data_ptr()), "execution");
}

at::Tensor emit(const at::Tensor& value, const at::Tensor& out) {
  if (!out.defined()) return value;
  out.copy_(value);
  return out;
}

// The longest sequence, as the caller gave it, or read back (the contract's max_seqlen = 0: a sync).
int64_t seqlen_bound(const ops::AttentionArgs& a) {
  if (a.max_seqlen > 0) return a.max_seqlen;
  at::Tensor cu = a.cu_seqlens.to(at::kCPU, at::kLong);
  return (cu.narrow(0, 1, cu.numel() - 1) - cu.narrow(0, 0, cu.numel() - 1)).max().item<int64_t>();
}

class CudnnAttention final : public ops::Attention {
 public:
  std::optional<std::string> decline(const ops::AttentionArgs& a) const override {
    std::string why = cudnn_attention_unfit(a);
    if (why.empty()) return std::nullopt;
    return why;
  }

 protected:
  ops::AttentionResult run_forward(const ops::AttentionArgs& a) override {
    const int64_t T = a.q.size(0), Hq = a.q.size(1), Dv = a.v.size(2);
    if (T == 0)
      return {emit(at::empty({0, Hq, Dv}, a.q.options()), a.out), at::empty({Hq, 0}, a.q.options().dtype(at::kFloat)), {}};
    ops::AttentionArgs b = a;
    b.max_seqlen = seqlen_bound(a);
    const at::Tensor q = cudnn_layout(a.q), k = cudnn_layout(a.k), v = cudnn_layout(a.v);
    const Shape s = shape_of(b, q, k, v, false);
    Ragged r = ragged(a.cu_seqlens, s.B, T);
    at::Tensor out = at::empty({T, Hq, Dv}, q.options());
    at::Tensor stats = at::empty({T, Hq}, q.options().dtype(at::kFloat));
    fe::graph::Graph& g = graph_for(s, at::native::getCudnnHandle());
    std::unordered_map<int64_t, void*> pack = {
        {Q, q.data_ptr()}, {K, k.data_ptr()}, {V, v.data_ptr()}, {O, out.data_ptr()}, {STATS, stats.data_ptr()},
        {SEQ_Q, r.seqlens.data_ptr()}, {SEQ_KV, r.seqlens.data_ptr()},
        {OFF_Q, r.offset(s.q_tok).data_ptr()}, {OFF_K, r.offset(s.k_tok).data_ptr()},
        {OFF_V, r.offset(s.v_tok).data_ptr()}, {OFF_O, r.offset(Hq * Dv).data_ptr()},
        {OFF_STATS, r.offset(Hq).data_ptr()}};
    run(g, pack, q);
    return {emit(out, a.out), stats.t(), {}};
  }

  ops::AttentionGrads run_backward(const ops::AttentionArgs& a, const ops::AttentionBackwardArgs& b) override {
    ops::AttentionGrads g;
    const int64_t T = a.q.size(0), Hq = a.q.size(1), Dv = a.v.size(2);
    if (T == 0) {
      g.dq = emit(at::empty_like(a.q), b.grads_out.dq);
      g.dk = emit(at::empty_like(a.k), b.grads_out.dk);
      g.dv = emit(at::empty_like(a.v), b.grads_out.dv);
      return g;
    }
    ops::AttentionArgs c = a;
    c.max_seqlen = seqlen_bound(a);
    const at::Tensor q = cudnn_layout(a.q), k = cudnn_layout(a.k), v = cudnn_layout(a.v);
    const Shape s = shape_of(c, q, k, v, true);
    Ragged r = ragged(a.cu_seqlens, s.B, T);
    // o/do as the graph describes them: dense [T, Hq, Dv]; the stats token-major [T, Hq], as forward made them.
    const at::Tensor o = b.out.contiguous(), dout = b.grad_out.contiguous();
    const at::Tensor stats = b.lse.t().contiguous();
    at::Tensor dq = at::empty({T, Hq, a.q.size(2)}, q.options());
    at::Tensor dk = at::empty({T, a.k.size(1), a.k.size(2)}, q.options());
    at::Tensor dv = at::empty({T, a.v.size(1), Dv}, q.options());
    fe::graph::Graph& graph = graph_for(s, at::native::getCudnnHandle());
    std::unordered_map<int64_t, void*> pack = {
        {Q, q.data_ptr()}, {K, k.data_ptr()}, {V, v.data_ptr()}, {O, o.data_ptr()}, {DO, dout.data_ptr()},
        {STATS, stats.data_ptr()}, {DQ, dq.data_ptr()}, {DK, dk.data_ptr()}, {DV, dv.data_ptr()},
        {SEQ_Q, r.seqlens.data_ptr()}, {SEQ_KV, r.seqlens.data_ptr()},
        {OFF_Q, r.offset(s.q_tok).data_ptr()}, {OFF_K, r.offset(s.k_tok).data_ptr()},
        {OFF_V, r.offset(s.v_tok).data_ptr()}, {OFF_O, r.offset(Hq * Dv).data_ptr()},
        {OFF_STATS, r.offset(Hq).data_ptr()}, {OFF_DQ, r.offset(Hq * a.q.size(2)).data_ptr()},
        {OFF_DK, r.offset(a.k.size(1) * a.k.size(2)).data_ptr()}, {OFF_DV, r.offset(a.v.size(1) * Dv).data_ptr()}};
    run(graph, pack, q);
    g.dq = emit(dq, b.grads_out.dq);
    g.dk = emit(dk, b.grads_out.dk);
    g.dv = emit(dv, b.grads_out.dv);
    return g;
  }
};

}  // namespace

std::string cudnn_attention_unfit(const ops::AttentionArgs& a) {
  if (!a.q.is_cuda()) return "not on CUDA";
  if (a.q.scalar_type() != at::kBFloat16 && a.q.scalar_type() != at::kHalf) return "dtype is not bf16/fp16";
  if (a.sinks.defined()) return "attention sinks";
  if (a.window_left >= 0) return "a sliding window";
  if (a.groups.defined()) return "bidirectional groups";
  // Its graphs describe one ragged offset tensor for q, k and v alike: keys with their own boundaries (ring
  // attention's blocks) are another graph, not built or certified yet.
  if (a.cu_seqlens_k.defined()) return "separate key boundaries (cu_seqlens_k)";
  const int64_t D = a.q.size(2), Dv = a.v.size(2);
  if (D % 8 != 0 || Dv % 8 != 0 || D > 128 || Dv > 128)
    return str("head dims ", D, "/", Dv, " (this backend takes multiples of 8 up to 128; larger ones, e.g. MLA's 192/128, "
               "are not certified on a GPU yet)");
  if (at::cuda::getDeviceProperties(a.q.get_device())->major < 9) return "ragged layouts need sm_90 or newer";
  // cuDNN sizes its grid and the deterministic backward's fp32 dQ workspace by the nominal batch x longest
  // sequence, not by the tokens: many short packed samples under a long bound (or a static-shape batch
  // padded with empty spans) would cost far more than flash, which walks the real lengths.
  const int64_t T = a.q.size(0), B = pow2_at_least(a.cu_seqlens.numel() - 1, 1);
  const int64_t S = pow2_at_least(a.max_seqlen > 0 ? a.max_seqlen : T, 64);
  if (B * S > kMinNominalToDecline && B * S > kMaxNominalOverTokens * T)
    return str("a nominal ", B, " x ", S, " grid for ", T, " tokens (more than ", kMaxNominalOverTokens,
               "x: many short sequences under a long bound)");
  return {};
}

std::shared_ptr<ops::Attention> make_cudnn_attention() { return std::make_shared<CudnnAttention>(); }

}  // namespace ax::fused_attn
