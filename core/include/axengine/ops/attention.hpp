// attention — causal grouped-query attention over packed variable-length sequences (flash-attention's
// varlen form). Contract: docs/ops/attention.md.
//
// Sequence b owns rows [cu_seqlens[b], cu_seqlens[b+1]). Query head h attends with key/value head
// h / (Hq / Hkv). Within a sequence, query i sees keys j <= i (causal) and, with window_left >= 0, only
// j >= i - window_left. out = softmax(scale · q kᵀ + mask) v; rows never attend across sequences.
// Optional attention sinks (gpt_oss): a per-head logit that joins every row's softmax and is then dropped,
// so a row's weights sum to less than one. Backends that take them claim the layout "sinks".
// Optional bidirectional groups (gemma3's images): rows of one sequence with the same group id >= 0 also see
// each other's later rows; the window still applies. Backends that cannot take them decline such calls.
// Optional separate key-side boundaries (cu_seqlens_k, flash-attn's varlen API): sequence b's queries and keys
// then differ in length, and the masks align them bottom-right (ring attention's blocks, docs/ops/attention.md).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct AttentionArgs {
  at::Tensor q;  // [T, Hq, D]
  at::Tensor k;  // [Tk, Hkv, D]   Hq % Hkv == 0; Tk = T unless cu_seqlens_k is given
  at::Tensor v;  // [Tk, Hkv, Dv]
  at::Tensor cu_seqlens;  // int32 [B+1], cu_seqlens[0] == 0, nondecreasing, cu_seqlens[B] == T
  int64_t max_seqlen = 0;  // max sequence length (0: the op computes it, a device sync)
  double softmax_scale = 0.0;  // 0: 1/sqrt(D)
  bool causal = true;
  // sliding window: keys i - window_left .. i; -1 = unlimited. Without causal it limits the left side only.
  int64_t window_left = -1;
  at::Tensor out;  // optional preallocated output [T, Hq, Dv]
  bool check_values = true;  // check cu_seqlens contents on the host (a device sync)
  // Optional fp32 [Hq] on q's device: head h's sink logit (already in score units, not scaled). With it
  // lse_f = logaddexp(lse, sink_h) and out = Σ_j exp(S_ij − lse_f) v_j. Only backends claiming the
  // layout "sinks" are selected for such calls (docs/ops/attention.md).
  at::Tensor sinks;
  // Optional int32 [T] on q's device, with causal = true: query i also sees key j > i (of its sequence) when
  // groups[i] == groups[j] >= 0 (the tokens of one image, transformers' token_type_ids mask); -1 = no group.
  // The window still hides keys left of i - window_left. Backends that cannot take them decline the call.
  at::Tensor groups;
  // Optional int32 [B+1] on q's device: the key rows' own boundaries (sequence b's keys are k rows
  // [cu_seqlens_k[b], cu_seqlens_k[b+1])), as flash-attn's varlen cu_seqlens_k; undefined = cu_seqlens. With
  // Lq and Lk a sequence's lengths, query a (0-based) is aligned with key a + Lk - Lq: causal shows it keys
  // j <= a + Lk - Lq, the window keys j >= a + Lk - Lq - window_left (flash-attn's bottom-right alignment).
  // A row that sees no key gets out = 0 and lse = -inf. Not with groups. Backends that cannot take it decline.
  at::Tensor cu_seqlens_k;
  int64_t max_seqlen_k = 0;  // longest key sequence (0: the op computes it); only with cu_seqlens_k
};

struct AttentionResult {
  at::Tensor out;  // [T, Hq, Dv], dtype of q
  // Log-sum-exp of the scaled scores per (head, row), fp32 [Hq, T] (natural log), the sink included when
  // there is one; -inf for a row that sees no key (and has no sink). Part of the contract so that backends can
  // share it with the engine (ring attention merges blocks by it); backward receives it back.
  at::Tensor lse;
  std::vector<at::Tensor> saved;  // anything else the backend wants back in backward
};

struct AttentionGrads {
  at::Tensor dq, dk, dv;
  at::Tensor dsinks;  // fp32 [Hq]; defined exactly when args.sinks is
};

// Backward computes P = exp(S - lse) and rowsum(dO ∘ out) from the lse and out it is handed, not its own
// forward's: ring attention hands each block the merged (out, lse) of all blocks.
struct AttentionBackwardArgs {
  at::Tensor grad_out;  // [T, Hq, Dv]
  at::Tensor out;       // the forward's out (or a merged one)
  at::Tensor lse;       // the forward's lse (or a merged one)
  std::vector<at::Tensor> saved;
  AttentionGrads grads_out;  // optional preallocated outputs
};

void validate(const AttentionArgs& args);
void validate_backward(const AttentionArgs& args, const AttentionBackwardArgs& bwd);

// Determinism: out and lse bitwise identical across identical calls; dq, dk, dv too (dk/dv are sums over
// query rows and heads of a group: reduce in a fixed order).
class Attention : public KernelBackend {
 public:
  static constexpr const char* kOp = "attention";

  AttentionResult forward(const AttentionArgs& args) {
    validate(args);
    return run_forward(args);
  }
  AttentionGrads backward(const AttentionArgs& args, const AttentionBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }
  // Why this backend will not take these (valid) arguments, or nullopt when it takes them. A backend whose
  // kernels cover only part of the contract declines the rest; attention_chain hands the call, forward and
  // backward, to the next backend of the preference list (docs/ops/attention.md, "Declining"). A pure
  // function of shapes, dtypes and flags, never of tensor values.
  virtual std::optional<std::string> decline(const AttentionArgs&) const { return std::nullopt; }

 protected:
  virtual AttentionResult run_forward(const AttentionArgs& args) = 0;
  virtual AttentionGrads run_backward(const AttentionArgs& args, const AttentionBackwardArgs& bwd) = 0;
};

// The backends of a preference list as one: each call goes to the first that does not decline it
// (ops/decline_chain.hpp). The engine's models call attention through this.
struct NamedAttention {
  std::string name;
  std::shared_ptr<Attention> backend;
};
std::shared_ptr<Attention> attention_chain(std::vector<NamedAttention> backends);

}  // namespace ax::ops
