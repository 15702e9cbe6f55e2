// Reference linear_ce: the whole [T, V] logits at once (memory O(T·V): the oracle, not a production path).
//   logits = round(h · Wᵀ)         the compute dtype's GEMM result, as transformers' lm_head(h)
//   lse    = logsumexp(logits)     fp32 (fp64 for fp64 inputs)
//   loss   = −log_softmax(logits)[target]   (transformers' fp32 cross_entropy; 0 at ignored targets)
// Backward: dh = (grad_loss · (softmax(logits) − onehot(target))) · W, zero rows at ignored targets, in fp32
// with one rounding at the end.
#include <memory>

#include "axengine/ops/linear_ce.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

struct Logits {
  at::Tensor z;      // [T, V] in the compute type, after the compute dtype's rounding
  at::Tensor valid;  // bool [T]
  at::Tensor index;  // int64 [T, 1], the target (0 at ignored rows)
};

Logits logits_of(const LinearCeArgs& a, at::ScalarType ct) {
  Logits l;
  l.z = at::matmul(a.h.to(ct), a.weight.to(ct).t()).to(a.h.scalar_type()).to(ct);
  l.valid = a.targets.ne(a.ignore_index);
  l.index = at::where(l.valid, a.targets, at::zeros_like(a.targets)).unsqueeze(1);
  return l;
}

class ReferenceLinearCe final : public LinearCe {
 protected:
  LinearCeResult run_forward(const LinearCeArgs& a) override {
    const auto ct = ref::compute_type(a.h.scalar_type());
    Logits l = logits_of(a, ct);
    LinearCeResult r;
    r.lse = at::logsumexp(l.z, 1);
    at::Tensor nll = -at::log_softmax(l.z, 1).gather(1, l.index).squeeze(1);
    r.loss = at::where(l.valid, nll, at::zeros_like(nll));
    return r;
  }

  at::Tensor run_backward(const LinearCeArgs& a, const LinearCeBackwardArgs& b) override {
    const auto ct = ref::compute_type(a.h.scalar_type());
    Logits l = logits_of(a, ct);
    at::Tensor p = at::exp(l.z - b.lse.to(ct).unsqueeze(1));
    at::Tensor onehot = at::zeros_like(p).scatter_(1, l.index, 1.0);
    at::Tensor scale = at::where(l.valid, b.grad_loss.to(ct), at::zeros_like(b.grad_loss, ct)).unsqueeze(1);
    at::Tensor dz = (p - onehot) * scale;
    return at::matmul(dz, a.weight.to(ct)).to(a.h.scalar_type());
  }
};

}  // namespace

std::shared_ptr<LinearCe> make_reference_linear_ce() { return std::make_shared<ReferenceLinearCe>(); }

}  // namespace ax::ops
