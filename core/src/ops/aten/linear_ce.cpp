// The `aten` linear_ce: the LM head and the cross-entropy in chunks of tokens, so that the [T, V] logits
// never exist whole. Per chunk of rows [t0, t1):
//   forward:  z = h_c · Wᵀ (a compute-dtype GEMM: fp32 accumulation, rounded) → fp32 → lse_c = logsumexp(z),
//             loss_c = lse_c − z[target] (0 at ignored targets); with grad_in_forward, z is then turned in
//             place into softmax(z) − onehot(target) (zero rows at ignored targets) and
//             dh_unit_c = that, rounded to the compute dtype, · W goes into the saved [T, H] buffer
//   backward: with the forward's saved dh_unit, dh = round(grad_loss · dh_unit) (no GEMM); without it, z
//             again (recomputed), turned in place into grad_loss · (softmax(z) − onehot(target)), then
//             dh_c = that, rounded to the compute dtype, · W
// Peak extra memory is one chunk of logits in the compute dtype plus its fp32 copy, bounded by kChunkBytes
// whatever T is (kAtenLinearCeChunkBytes, ops/aten/register_fusions.hpp), plus the [T, H] dh_unit with the
// flag. No host syncs: the chunk bounds come from shapes, the rest are device ops.
#include <algorithm>
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/linear_ce.hpp"

namespace ax::ops {
namespace {

int64_t chunk_rows(int64_t chunk_bytes, int64_t V) {
  return std::max<int64_t>(1, chunk_bytes / (V * int64_t(sizeof(float))));
}

struct Chunk {
  at::Tensor z;      // fp32 [n, V] logits, a fresh tensor the caller may overwrite
  at::Tensor valid;  // bool [n]
  at::Tensor index;  // int64 [n, 1]: the target, 0 at ignored rows
};

Chunk chunk_logits(const LinearCeArgs& a, int64_t t0, int64_t n) {
  Chunk c;
  at::Tensor z = at::mm(a.h.narrow(0, t0, n), a.weight.t());
  // mm's output is fresh; for fp32 `to` returns it as is, otherwise the fp32 copy.
  c.z = z.to(at::kFloat);
  at::Tensor t = a.targets.narrow(0, t0, n);
  c.valid = t.ne(a.ignore_index);
  c.index = t.masked_fill(c.valid.logical_not(), 0).unsqueeze(1);
  return c;
}

// z (the chunk's fp32 logits) in place → scale · (softmax(z) − onehot(target)), scale [n] already 0 at
// ignored rows. `lse` is the forward's: softmax = exp(z − lse).
at::Tensor to_gradient(Chunk& c, const at::Tensor& lse, const at::Tensor& scale) {
  at::Tensor p = c.z.sub_(lse.unsqueeze(1)).exp_();
  // p[target] − 1: one index per row, so scatter_ writes each element once (deterministic).
  at::Tensor at_target = p.gather(1, c.index).sub_(c.valid.unsqueeze(1).to(at::kFloat));
  p.scatter_(1, c.index, at_target);
  return p.mul_(scale.unsqueeze(1));
}

class AtenLinearCe final : public LinearCe {
 public:
  explicit AtenLinearCe(int64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

 protected:
  LinearCeResult run_forward(const LinearCeArgs& a) override {
    const int64_t T = a.h.size(0), V = a.weight.size(0), step = chunk_rows(chunk_bytes_, V);
    LinearCeResult r;
    auto f32 = a.h.options().dtype(at::kFloat);
    r.loss = at::empty({T}, f32);
    r.lse = at::empty({T}, f32);
    at::Tensor dh_unit;
    if (a.grad_in_forward) {
      dh_unit = at::empty({T, a.h.size(1)}, a.h.options().memory_format(at::MemoryFormat::Contiguous));
      r.saved = {dh_unit};
    }
    for (int64_t t0 = 0; t0 < T; t0 += step) {
      const int64_t n = std::min(step, T - t0);
      Chunk c = chunk_logits(a, t0, n);
      at::Tensor lse = r.lse.narrow(0, t0, n);
      at::logsumexp_out(lse, c.z, {1});
      at::Tensor picked = c.z.gather(1, c.index).squeeze(1);
      at::Tensor loss = r.loss.narrow(0, t0, n);
      at::sub_out(loss, lse, picked).masked_fill_(c.valid.logical_not(), 0.0);
      if (dh_unit.defined()) {
        at::Tensor g = to_gradient(c, lse, c.valid.to(at::kFloat));
        at::Tensor dh_c = dh_unit.narrow(0, t0, n);
        at::mm_out(dh_c, g.to(a.h.scalar_type()), a.weight);
      }
    }
    return r;
  }

  at::Tensor run_backward(const LinearCeArgs& a, const LinearCeBackwardArgs& b) override {
    const int64_t T = a.h.size(0), V = a.weight.size(0), step = chunk_rows(chunk_bytes_, V);
    const auto dt = a.h.scalar_type();
    if (!b.saved.empty()) {
      // grad_loss's type is the statistics type (fp32; fp64 for fp64 inputs): type promotion makes the
      // multiply run in it (compute dtype × fp32 → fp32), then one rounding to the compute dtype.
      at::Tensor scale = b.grad_loss.masked_fill(a.targets.eq(a.ignore_index), 0.0).unsqueeze(1);
      return at::mul(b.saved[0], scale).to(dt);
    }
    at::Tensor dh = at::empty({T, a.h.size(1)}, a.h.options());
    for (int64_t t0 = 0; t0 < T; t0 += step) {
      const int64_t n = std::min(step, T - t0);
      Chunk c = chunk_logits(a, t0, n);
      at::Tensor scale = b.grad_loss.narrow(0, t0, n).masked_fill(c.valid.logical_not(), 0.0);
      at::Tensor p = to_gradient(c, b.lse.narrow(0, t0, n), scale);
      at::Tensor dh_c = dh.narrow(0, t0, n);
      at::mm_out(dh_c, p.to(dt), a.weight);
    }
    return dh;
  }

 private:
  int64_t chunk_bytes_;
};

}  // namespace

std::shared_ptr<LinearCe> make_aten_linear_ce(int64_t chunk_bytes) { return std::make_shared<AtenLinearCe>(chunk_bytes); }

}  // namespace ax::ops
