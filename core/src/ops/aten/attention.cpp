// Production attention: LibTorch's own FlashAttention-2 kernels in their varlen form
// (at::_flash_attention_forward / _backward with cum_seq_q = cu_seqlens and cum_seq_k = cu_seqlens_k, or
// cu_seqlens again without it), bf16/fp16 on CUDA. Flash aligns unequal query and key lengths bottom-right, as
// the contract does; a row that sees no key comes out of flash with out 0 and lse +inf (its own marker, which
// makes its backward's P = exp(S − lse) zero): the contract's lse there is −inf, so the forward turns +inf into
// −inf and the backward turns it back. Only calls with cu_seqlens_k can have such rows.
// GQA is native (k/v keep their Hkv heads, nothing is repeated); the sliding window is flash's
// window_size_left with window_size_right = 0 under causal. The forward's varlen lse is already the
// contract's fp32 [Hq, T]; the forward's rng state (unused without dropout, but the backward's
// signature wants it) travels in `saved`.
//
// Flash takes one head dim, a multiple of 8 up to 256, for q, k and v alike. Other head dims are zero-padded
// up to P = max(D, Dv) rounded up to 8 (MLA's qk 192 / v 128: v padded to 192, as transformers does for
// flash): zero columns of q and k add nothing to q·k (the scale stays 1/√D of the real D), zero columns of v
// make zero columns of out, which are cut off. Backward hands flash out and dO padded the same way (their
// zero columns leave rowsum(dO ∘ O) unchanged) and cuts dq, dk, dv back to their own widths. What stays
// beyond flash, P above 256, is computed here by the reference math, with one log line per process.
// (Refusing those in Requirements is not possible: requirements see device, dtype and format, not shapes.)
// fp32 and pre-sm_80 GPUs are refused in the Requirements instead (register.cpp), so selection falls
// through to `reference`.
//
// Sinks (a per-head logit s_h that joins each row's softmax and is dropped; docs/ops/attention.md) wrap
// flash rather than change it. Flash gives out = Σ_j exp(S_ij − lse_i) v_j and lse; with
// lse_f = logaddexp(lse, s_h) the sink-aware output is out_f = Σ_j exp(S_ij − lse_f_i) v_j
// = out · exp(lse − lse_f), a per-(row, head) rescale. Backward: flash recomputes P = exp(S − lse_given)
// and D = rowsum(dO ∘ out_given) from what it is handed; given (out_f, lse_f) that P is the sink-aware
// one, and the sink-aware gradient of S is exactly P ∘ (dP − D) with those (∂lse_f/∂S_ij = P_ij, the
// sink only lowers each row's mass), so flash's dq/dk/dv are the right ones unchanged. The sink's own
// gradient is outside flash: ∂out_f_i/∂s_h = −exp(s_h − lse_f_i) · out_f_i, so
//   dsink_h = −Σ_i exp(s_h − lse_f_i) · rowsum(dO_i ∘ out_f_i),
// computed here in fp32 (a fixed-order reduction: deterministic).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ops/_flash_attention_backward.h>
#include <ATen/ops/_flash_attention_forward.h>

#include "axengine/log.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/strings.hpp"

namespace ax::ops {

std::shared_ptr<Attention> make_reference_attention();  // ops/reference/attention.cpp

namespace {

// PyTorch's flash backward has no "deterministic" argument: it reads
// at::globalContext().deterministicAlgorithms() (and ...WarnOnly()) inside the op, and only with the flag
// on and warn-only off does it accumulate dq in per-split buffers summed in a fixed order instead of
// with atomic adds whose order varies run to run. The contract demands bitwise-deterministic dq/dk/dv,
// so the call runs with the flag on; the previous settings are restored when the scope ends (throw
// included) so the rest of the program keeps its own choice. fillUninitializedMemory is switched off for
// the same span: it is a debugging aid tied to deterministic mode that would NaN-fill every buffer the
// backward allocates (extra kernels, no effect on results). The flags are process-wide, not per thread;
// the mutex keeps our own concurrent calls from interleaving save/restore. Another thread launching an
// op that has no deterministic implementation during this window would see the flag (in this engine
// the training step is the only thread issuing CUDA work).
class DeterministicScope {
 public:
  DeterministicScope() : lock_(mutex()) {
    auto& ctx = at::globalContext();
    algorithms_ = ctx.deterministicAlgorithms();
    warn_only_ = ctx.deterministicAlgorithmsWarnOnly();
    fill_ = ctx.deterministicFillUninitializedMemory();
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
    ctx.setDeterministicFillUninitializedMemory(false);
  }
  ~DeterministicScope() {
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(algorithms_, warn_only_);
    ctx.setDeterministicFillUninitializedMemory(fill_);
  }
  DeterministicScope(const DeterministicScope&) = delete;
  DeterministicScope& operator=(const DeterministicScope&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  std::lock_guard<std::mutex> lock_;
  bool algorithms_ = false, warn_only_ = false, fill_ = true;
};

// The one head dim flash runs this call at: q/k's and v's, the larger, rounded up to a multiple of 8.
int64_t flash_dim(const AttentionArgs& a) { return (std::max(a.q.size(2), a.v.size(2)) + 7) / 8 * 8; }

// Why flash cannot take this call, or empty when it can.
std::string flash_unfit(const AttentionArgs& a) {
  if (!a.q.is_cuda()) return "not on CUDA";
  if (a.q.scalar_type() != at::kBFloat16 && a.q.scalar_type() != at::kHalf) return "dtype is not bf16/fp16";
  // Flash's masks are causal / windowed bands only: a group's later rows are not one of them.
  if (a.groups.defined()) return "bidirectional groups (gemma3's image tokens)";
  if (flash_dim(a) > 256)
    return str("head dims ", a.q.size(2), "/", a.v.size(2), " (flash takes at most 256, padding included)");
  if (a.k.size(0) == 0) return "no key rows";
  return {};
}

// t [T, H, d] with zero columns appended up to P (t itself when d == P).
at::Tensor pad_to(const at::Tensor& t, int64_t P) {
  return t.size(2) == P ? t : at::constant_pad_nd(t, {0, P - t.size(2)});
}
// The first d columns of a padded result, dense (a view would keep the padded storage alive).
at::Tensor cut_to(const at::Tensor& t, int64_t d) { return t.size(2) == d ? t : t.narrow(2, 0, d).contiguous(); }

void note_fallback(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    log::warn(str("attention/aten: ", why, ": this and any such call use the reference math (fp32, O(L^2) memory)"));
}

// Flash reads rows through 16-byte vector loads: the last dim must be dense and the row/head strides
// multiples of 8 elements. Anything else (a strided view from the conformance suite or a fused qkv slice
// that breaks the rule) is copied once.
at::Tensor flash_layout(const at::Tensor& t) {
  const bool ok = t.stride(2) == 1 && t.stride(1) % 8 == 0 && t.stride(0) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? t : t.contiguous();
}

// The bound flash sizes its grid by: the caller's, or derived from cu_seqlens (contract: 0 = derive it,
// a device sync). Never below 2: with a bound of 1 and GQA, flash's varlen forward reshapes q as if
// every sequence had exactly one row ("seqlenq_ngroups_swapped"), which breaks with empty sequences in
// the pack; a looser bound only adds an idle tile row.
int64_t seqlen_bound(const at::Tensor& cu_seqlens, int64_t max_seqlen) {
  int64_t L = max_seqlen;
  if (L == 0) {
    at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong);
    L = (cu.narrow(0, 1, cu.numel() - 1) - cu.narrow(0, 0, cu.numel() - 1)).max().item<int64_t>();
  }
  return std::max<int64_t>(L, 2);
}

// The key side's boundaries and bound: its own with cu_seqlens_k, the queries' otherwise.
struct Bounds {
  at::Tensor cu_q, cu_k;
  int64_t max_q = 0, max_k = 0;
};
Bounds bounds(const AttentionArgs& a) {
  Bounds b;
  b.cu_q = a.cu_seqlens.contiguous();
  b.max_q = seqlen_bound(b.cu_q, a.max_seqlen);
  if (!a.cu_seqlens_k.defined()) {
    b.cu_k = b.cu_q;
    b.max_k = b.max_q;
  } else {
    b.cu_k = a.cu_seqlens_k.contiguous();
    b.max_k = seqlen_bound(b.cu_k, a.max_seqlen_k);
  }
  return b;
}

// lse's marker of a row that sees no key: flash's +inf and the contract's −inf, one into the other.
at::Tensor swap_inf(const at::Tensor& lse, double from, double to) {
  return lse.masked_fill(lse == from, to);
}

double scale_of(const AttentionArgs& a) {
  return a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(a.q.size(2)));
}

// window_size_left / _right as flash takes them: -1 = unlimited; causal is right = 0.
int64_t window_left(const AttentionArgs& a) { return a.window_left >= 0 ? a.window_left : -1; }
int64_t window_right(const AttentionArgs& a) { return a.causal ? 0 : -1; }

at::Tensor emit(const at::Tensor& value, const at::Tensor& out) {
  if (!out.defined()) return value;
  out.copy_(value);
  return out;
}

// The forward's (out, lse) with the sinks joined: {out_f, lse_f} (see the top of the file).
std::pair<at::Tensor, at::Tensor> with_sinks(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& sinks) {
  at::Tensor lse_f = at::logaddexp(lse, sinks.unsqueeze(1));                        // [Hq, T]
  at::Tensor factor = at::exp(lse - lse_f).transpose(0, 1).unsqueeze(-1);            // [T, Hq, 1]
  return {(out.to(at::kFloat) * factor).to(out.scalar_type()), lse_f};
}

// dsink_h = −Σ_i exp(s_h − lse_f_i) · rowsum(dO_i ∘ out_f_i), fp32 [Hq].
at::Tensor sink_grad(const at::Tensor& grad_out, const at::Tensor& out_f, const at::Tensor& lse_f, const at::Tensor& sinks) {
  at::Tensor rowdot = (grad_out.to(at::kFloat) * out_f.to(at::kFloat)).sum(-1).transpose(0, 1);  // [Hq, T]
  return -(at::exp(sinks.unsqueeze(1) - lse_f) * rowdot).sum(1);
}

class AtenAttention final : public Attention {
 protected:
  AttentionResult run_forward(const AttentionArgs& a) override {
    if (auto why = flash_unfit(a); !why.empty()) {
      note_fallback(why);
      return reference_->forward(a);  // validates again: only on this fallback path
    }
    const int64_t T = a.q.size(0), Hq = a.q.size(1);
    if (T == 0) {
      at::Tensor out = at::empty({0, Hq, a.v.size(2)}, a.q.options());
      return {emit(out, a.out), at::empty({Hq, 0}, a.q.options().dtype(at::kFloat)), {}};
    }
    const Bounds n = bounds(a);
    const int64_t P = flash_dim(a);
    auto [out, lse, rng_state, unused, debug_mask] = at::_flash_attention_forward(
        flash_layout(pad_to(a.q, P)), flash_layout(pad_to(a.k, P)), flash_layout(pad_to(a.v, P)), n.cu_q, n.cu_k, n.max_q, n.max_k,
        /*dropout_p=*/0.0, a.causal, /*return_debug_mask=*/false, scale_of(a), window_left(a), window_right(a));
    (void)debug_mask;
    out = cut_to(out, a.v.size(2));
    if (lse.dim() != 2 || lse.size(0) != Hq || lse.size(1) != T)
      throw std::runtime_error(ax::str("attention/aten: this LibTorch's varlen flash forward returned lse of shape ",
                                   lse.sizes(), ", expected [Hq, T] = [", Hq, ", ", T, "]"));
    if (a.cu_seqlens_k.defined()) lse = swap_inf(lse, INFINITY, -INFINITY);
    if (a.sinks.defined()) std::tie(out, lse) = with_sinks(out, lse, a.sinks);
    return {emit(out, a.out), lse, {rng_state, unused}};
  }

  AttentionGrads run_backward(const AttentionArgs& a, const AttentionBackwardArgs& b) override {
    if (!flash_unfit(a).empty()) return reference_->backward(a, b);  // the forward fell back too
    AttentionGrads g;
    if (a.q.size(0) == 0) {
      g.dq = emit(at::empty_like(a.q), b.grads_out.dq);
      g.dk = emit(at::zeros_like(a.k), b.grads_out.dk);  // key rows without queries (cu_seqlens_k) get no gradient
      g.dv = emit(at::zeros_like(a.v), b.grads_out.dv);
      if (a.sinks.defined()) g.dsinks = emit(at::zeros_like(a.sinks), b.grads_out.dsinks);
      return g;
    }
    if (b.saved.size() != 2)
      throw std::runtime_error(ax::str("attention/aten: backward needs the 2 tensors its forward saved, got ", b.saved.size()));
    const Bounds n = bounds(a);
    const int64_t P = flash_dim(a);
    const at::Tensor lse = a.cu_seqlens_k.defined() ? swap_inf(b.lse, -INFINITY, INFINITY) : b.lse.contiguous();
    DeterministicScope deterministic;
    auto [dq, dk, dv] = at::_flash_attention_backward(
        pad_to(b.grad_out, P), flash_layout(pad_to(a.q, P)), flash_layout(pad_to(a.k, P)), flash_layout(pad_to(a.v, P)),
        pad_to(b.out, P), lse, n.cu_q, n.cu_k, n.max_q, n.max_k, /*dropout_p=*/0.0, a.causal, b.saved[0], b.saved[1],
        scale_of(a), window_left(a), window_right(a));
    g.dq = emit(cut_to(dq, a.q.size(2)), b.grads_out.dq);
    g.dk = emit(cut_to(dk, a.k.size(2)), b.grads_out.dk);
    g.dv = emit(cut_to(dv, a.v.size(2)), b.grads_out.dv);
    if (a.sinks.defined()) g.dsinks = emit(sink_grad(b.grad_out, b.out, b.lse, a.sinks), b.grads_out.dsinks);
    return g;
  }

 private:
  std::shared_ptr<Attention> reference_ = make_reference_attention();
};

}  // namespace

std::shared_ptr<Attention> make_aten_attention() { return std::make_shared<AtenAttention>(); }

}  // namespace ax::ops
