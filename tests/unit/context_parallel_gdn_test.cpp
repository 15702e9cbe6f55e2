// Context parallelism for the Gated DeltaNet hybrids (models/parts/gdn_context_parallel.hpp) inside one process,
// on the harness of context_parallel_test.cpp (unit/cp_harness.hpp): N models, one per thread, each running its
// zig-zag chunks of every packed row — the linear-attention layers with the conv1d window and the recurrent state
// handed from the row's previous chunk — give the single-process losses (1e-6) and LoRA gradients (5e-5: fp32
// round-off, see the case), for qwen3_5, qwen3_5_moe, qwen3_next and Qwen3.5's multimodal checkpoint form
// (qwen3_5_vl: its language model), with and without activation checkpointing,
// N = 2, 3, 4 (chunks of 6, 4 and 3 tokens, the conv1d window 3: samples start inside chunks, at chunk starts, and
// run across several chunks and ranks). The two ops alone are compared with the ops over whole rows (out and
// every gradient), and with an all-gather that hands each rank its own tensor back (the state and window never
// reach the next rank) the comparison fails; the split's ops are cut by its host table of the samples, the
// cu_seqlens tensor they are given never read (issue 38: no device sync per layer). The multi-process run over Gloo
// is in dist_context_test.cpp.
#include <doctest/doctest.h>

#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "axengine/error.hpp"
#include "models/autograd_ops.hpp"
#include "models/parts/gdn_context_parallel.hpp"
#include "ops/reference/register.hpp"
#include "unit/cp_harness.hpp"

using namespace ax::test::cp;

TEST_CASE("context parallel: Gated DeltaNet hybrids on N ranks give the single-process losses and LoRA grads to 1e-6 (CPU)") {
  at::set_num_threads(1);
  // Losses to 1e-6; gradients to 5e-5 of the larger of 1 and the tensor's largest magnitude. Measured: at most
  // 3.1e-5. These tiny hybrids (weights of std 0.2) magnify fp32 round-off in their gradients: in ONE process the
  // two GDN backends (aten's chunked form, the reference recurrence; both exact in exact arithmetic) already give
  // LoRA gradients 1.4e-5 apart, while the llama / qwen3 cases stay within 2.4e-7. The split itself is exact: the
  // ops case below holds it to 1e-12 in fp64.
  for (const char* name : {"qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3_5_vl"})
    for (bool ckpt : {false, true}) check_family(name, ckpt, 5e-5);
}

namespace {

const ax::Registry& reference_ops() {
  static ax::Registry reg = [] {
    ax::Registry r;
    ax::ops::register_reference_kernels(r);
    return r;
  }();
  return reg;
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// The largest difference of x from y, relative to the larger of 1 and y's largest magnitude.
double rel(const at::Tensor& x, const at::Tensor& y) {
  return (x - y).abs().max().item<double>() / std::max(1.0, y.abs().max().item<double>());
}

// conv1d (W = 3) then linear_attention over 2 rows of 24 tokens, whole against N ranks' chunks: the largest
// difference over every rank's outputs and input gradients (x of the conv; q, k, v, g, beta of the recurrence).
double gdn_ops_vs_whole(int64_t N, bool broken, at::ScalarType dt = at::kFloat) {
  const int64_t B = 2, S = 24, T = B * S, C = 7, W = 3, Hk = 2, Hv = 4, Dk = 3, Dv = 2;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  auto randn = [&](at::IntArrayRef shape) { return at::randn(shape, gen).to(dt); };
  const at::Tensor x = randn({T, C}), w = randn({C, W}), dy = randn({T, C});
  const at::Tensor q = randn({T, Hk, Dk}), k = randn({T, Hk, Dk}), v = randn({T, Hv, Dv});
  const at::Tensor g = -at::softplus(randn({T, Hv})), beta = at::sigmoid(randn({T, Hv}));
  const at::Tensor dout = randn({T, Hv, Dv});
  const at::Tensor cu = at::tensor(std::vector<int32_t>{0, 5, 9, 12, 19, 24, 41, 48}, at::kInt);
  const auto conv_op = reference_ops().kernel<ax::ops::CausalConv1d>("reference");
  const auto la_op = reference_ops().kernel<ax::ops::LinearAttention>("reference");
  struct Leaves {
    at::Tensor x, q, k, v, g, beta;
  };
  // Both ops on `in` (whole rows, or a rank's tokens through `gs`), their outputs' loss backward.
  // The split's ops get a cu_seqlens that cannot be read (a meta tensor, as a device one they must not read back):
  // they cut the chunks by the split's host table (ContextSplit::cu) alone.
  const at::Tensor unreadable = at::empty({cu.size(0)}, at::TensorOptions().dtype(at::kInt).device(at::kMeta));
  auto run = [&](const Leaves& in, const ax::models::GdnContextSplit* gs, const at::Tensor& dy_, const at::Tensor& do_) {
    ax::ops::CausalConv1dArgs ca;
    ca.x = in.x;
    ca.weight = w;
    ca.cu_seqlens = gs ? unreadable : cu;
    ax::ops::LinearAttentionArgs la;
    la.q = in.q, la.k = in.k, la.v = in.v, la.g = in.g, la.beta = in.beta;
    la.cu_seqlens = gs ? unreadable : cu;
    la.qk_l2norm = true;
    at::Tensor y = gs ? gs->conv1d(conv_op, ca) : ax::autograd::causal_conv1d(conv_op, ca).y;
    at::Tensor o = gs ? gs->linear_attention(la_op, la) : ax::autograd::linear_attention(la_op, la).out;
    ((y * dy_).sum() + (o * do_).sum()).backward();
    return std::make_pair(y, o);
  };
  const Leaves whole{leaf(x), leaf(q), leaf(k), leaf(v), leaf(g), leaf(beta)};
  const auto want = run(whole, nullptr, dy, dout);
  Shared shared(N);
  shared.broken_gather = broken;
  std::vector<double> err(static_cast<std::size_t>(N));
  std::vector<std::string> errors(static_cast<std::size_t>(N));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadComm comm(shared, r);
        const ax::models::ContextSplit split{&comm, B, S, ax::models::host_boundaries(cu)};
        const ax::models::GdnContextSplit gs(split);
        auto L = [&](const at::Tensor& t) { return leaf(split.local(t)); };
        const Leaves mine{L(x), L(q), L(k), L(v), L(g), L(beta)};
        const auto [y, o] = run(mine, &gs, split.local(dy), split.local(dout));
        double e = std::max(rel(y, split.local(want.first)), rel(o, split.local(want.second)));
        const std::vector<std::pair<at::Tensor, at::Tensor>> grads{{mine.x, whole.x}, {mine.q, whole.q}, {mine.k, whole.k},
                                                                  {mine.v, whole.v}, {mine.g, whole.g}, {mine.beta, whole.beta}};
        for (const auto& [got, whole_leaf] : grads) e = std::max(e, rel(got.grad(), split.local(whole_leaf.grad())));
        err[static_cast<std::size_t>(r)] = e;
      } catch (const std::exception& ex) {
        errors[static_cast<std::size_t>(r)] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
  return *std::max_element(err.begin(), err.end());
}

}  // namespace

TEST_CASE("context parallel: the Gated DeltaNet ops on N ranks' chunks are the ops over the whole rows") {
  at::set_num_threads(1);
  for (int64_t n : {2, 3, 4}) {
    CAPTURE(n);
    // Measured: 3e-8 in fp32 (the conv tails' gradients summed in another order), 7e-17 in fp64: the split is exact.
    CHECK(gdn_ops_vs_whole(n, false) <= 1e-6);
    CHECK(gdn_ops_vs_whole(n, false, at::kDouble) <= 1e-12);
  }
  CHECK(gdn_ops_vs_whole(2, true) > 1e-2);  // the planted bug (no window, no state from the other rank) is seen
}

TEST_CASE("context parallel: a Gated DeltaNet conv1d window wider than a chunk is refused by name") {
  Shared shared(4);
  ThreadComm comm(shared, 0);
  const ax::models::ContextSplit split{&comm, 1, 16, ax::models::host_boundaries(at::tensor(std::vector<int32_t>{0, 16}, at::kInt))};
  const ax::models::GdnContextSplit gs(split);  // chunks of 2 tokens
  ax::ops::CausalConv1dArgs a;
  a.x = at::randn({4, 5});
  a.weight = at::randn({5, 4});  // 3 tokens back
  try {
    gs.conv1d(reference_ops().kernel<ax::ops::CausalConv1d>("reference"), a);
    FAIL("no error");
  } catch (const ax::UsageError& e) {
    CHECK(std::string(e.what()).find("conv1d's window (4 tokens) reaches past the previous chunk of 2 tokens") != std::string::npos);
  }
}


TEST_CASE("context parallel: the split's samples are a host table; a split without one, or a device tensor as one, is refused") {
  Shared shared(2);
  ThreadComm comm(shared, 0);
  const ax::models::ContextSplit bare{&comm, 1, 16};
  CHECK_THROWS_WITH_AS(ax::models::GdnContextSplit{bare}, doctest::Contains("carries no host cu_seqlens"), ax::RuntimeError);
  const ax::models::ContextSplit short_table{&comm, 1, 16, ax::models::host_boundaries(at::tensor(std::vector<int32_t>{0, 12}, at::kInt))};
  CHECK_THROWS_WITH_AS(ax::models::GdnContextSplit{short_table}, doctest::Contains("must run from 0 to the batch's 16 tokens"),
                       ax::RuntimeError);
  const at::Tensor not_host = at::empty({2}, at::TensorOptions().dtype(at::kInt).device(at::kMeta));
  CHECK_THROWS_WITH_AS(ax::models::host_boundaries(not_host), doctest::Contains("cu_seqlens on meta given as the host copy"),
                       ax::RuntimeError);
}
