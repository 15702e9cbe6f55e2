// Core's production `aten` backends (core/src/ops/aten). Their accuracy against the reference is the
// conformance suite's job (CTest conformance_cli_aten_*); here: what the suite does not look at — the
// need_* flags, attention's in-backend fallback to the reference math, and (on a GPU) that the flash
// backward is bitwise repeatable and leaves the process's deterministic-algorithms setting as it found it.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <utility>
#include <vector>

#include "axengine/builtins.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/registry.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

AttentionArgs attention_args(at::ScalarType dt, int64_t D, const at::Device& dev, int64_t Dv = 0) {
  at::manual_seed(7);
  AttentionArgs a;
  const int64_t T = 40, Hq = 4, Hkv = 2;  // GQA, an empty sequence in the pack
  a.q = at::randn({T, Hq, D}).to(dev, dt);
  a.k = at::randn({T, Hkv, D}).to(dev, dt);
  a.v = at::randn({T, Hkv, Dv > 0 ? Dv : D}).to(dev, dt);
  a.cu_seqlens = at::tensor({0, 17, 17, 30, 40}, at::kInt).to(dev);
  return a;
}

}  // namespace

TEST_CASE("aten linear.lora: bf16 on CPU within tolerance of the reference, need_dx / need_dlora respected") {
  at::manual_seed(3);
  const auto dt = at::kBFloat16;
  LinearLoraArgs a;
  a.x = at::randn({2, 5, 64}).to(dt);
  a.weight = quantize_nf4(at::randn({48, 64}) * 0.2, 64);
  a.bias = at::randn({48}).to(dt);
  a.lora_a = (at::randn({8, 64}) * 0.3).to(dt);
  a.lora_b = (at::randn({48, 8}) * 0.3).to(dt);
  a.scaling = 2.0;
  auto aten = ax::test::builtin_backend<LinearLora>("aten");
  auto ref = ax::test::builtin_backend<LinearLora>("reference");
  at::Tensor y = aten->forward(a);
  CHECK(y.sizes() == at::IntArrayRef({2, 5, 48}));
  CHECK((y.scalar_type() == dt));
  CHECK(test::rel_err(y, ref->forward(a)) < 2e-2);

  LinearLoraBackwardArgs b;
  b.grad_y = at::randn({2, 5, 48}).to(dt);
  b.need_dlora = false;
  LinearLoraGrads g = aten->backward(a, b);
  CHECK(g.dx.defined());
  CHECK_FALSE(g.dlora_a.defined());
  b.need_dx = false;
  b.need_dlora = true;
  g = aten->backward(a, b);
  CHECK_FALSE(g.dx.defined());
  LinearLoraGrads r = ref->backward(a, b);
  CHECK(test::rel_err(g.dlora_a, r.dlora_a) < 2e-2);
  CHECK(test::rel_err(g.dlora_b, r.dlora_b) < 2e-2);
}

TEST_CASE("aten attention: off CUDA it computes with the reference math, bit for bit") {
  AttentionArgs a = attention_args(at::kBFloat16, 16, at::kCPU);
  auto aten = ax::test::builtin_backend<Attention>("aten");
  auto ref = ax::test::builtin_backend<Attention>("reference");
  AttentionResult r = aten->forward(a), e = ref->forward(a);
  CHECK(test::bit_equal(r.out, e.out));
  CHECK(test::bit_equal(r.lse, e.lse));
  AttentionBackwardArgs b;
  b.grad_out = at::randn(r.out.sizes()).to(r.out.scalar_type());
  b.out = r.out;
  b.lse = r.lse;
  b.saved = r.saved;
  AttentionGrads g = aten->backward(a, b), h = ref->backward(a, b);
  CHECK(test::bit_equal(g.dq, h.dq));
  CHECK(test::bit_equal(g.dk, h.dk));
  CHECK(test::bit_equal(g.dv, h.dv));
}

TEST_CASE("aten attention (CUDA): flash matches the reference (head dims padded, Dv != D), backward repeatable, global flags restored") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: flash attention cannot run on this machine");
    return;
  }
  auto& ctx = at::globalContext();
  const bool was = ctx.deterministicAlgorithms(), was_warn = ctx.deterministicAlgorithmsWarnOnly();
  const bool was_fill = ctx.deterministicFillUninitializedMemory();
  auto aten = ax::test::builtin_backend<Attention>("aten");
  auto ref = ax::test::builtin_backend<Attention>("reference");
  // {D, Dv}: flash's own dims; 20: padded to 24; MLA's qk 192 / v 128 (v padded to 192) and the reverse;
  // 264: beyond flash even padded, the in-backend reference fallback.
  for (auto dims : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {20, 20}, {192, 128}, {40, 72}, {264, 264}}) {
    const int64_t D = dims.first, Dv = dims.second;
    for (int64_t window : {-1, 5}) {
      CAPTURE(D);
      CAPTURE(Dv);
      CAPTURE(window);
      AttentionArgs a = attention_args(at::kBFloat16, D, at::Device(at::kCUDA, 0), Dv);
      a.window_left = window;
      AttentionResult r = aten->forward(a), e = ref->forward(a);
      CHECK(r.out.sizes() == at::IntArrayRef({40, 4, Dv}));
      CHECK(r.out.is_contiguous());
      CHECK(test::rel_err(r.out, e.out) < 2e-2);
      CHECK(test::rel_err(r.lse, e.lse) < 1e-4);
      AttentionBackwardArgs b;
      b.grad_out = at::randn(r.out.sizes(), r.out.options());
      b.out = r.out;
      b.lse = r.lse;
      b.saved = r.saved;
      ctx.setDeterministicAlgorithms(false, false);
      AttentionGrads g1 = aten->backward(a, b);
      CHECK_FALSE(ctx.deterministicAlgorithms());  // restored after the call
      AttentionGrads g2 = aten->backward(a, b);
      CHECK(test::bit_equal(g1.dq, g2.dq));
      CHECK(test::bit_equal(g1.dk, g2.dk));
      CHECK(test::bit_equal(g1.dv, g2.dv));
      AttentionGrads h = ref->backward(a, b);
      CHECK(g1.dq.sizes() == a.q.sizes());
      CHECK(g1.dv.sizes() == a.v.sizes());
      CHECK(test::rel_err(g1.dq, h.dq) < 3e-2);
      CHECK(test::rel_err(g1.dk, h.dk) < 3e-2);
      CHECK(test::rel_err(g1.dv, h.dv) < 3e-2);
      ctx.setDeterministicAlgorithms(true, true);  // a program's own warn-only choice survives too
      aten->backward(a, b);
      CHECK(ctx.deterministicAlgorithms());
      CHECK(ctx.deterministicAlgorithmsWarnOnly());
      CHECK(ctx.deterministicFillUninitializedMemory() == was_fill);
    }
  }
  ctx.setDeterministicAlgorithms(was, was_warn);
}
