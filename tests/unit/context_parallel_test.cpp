// Context parallelism ([distributed] context_parallel, models/context_parallel.hpp) inside one process: N models,
// one per thread, joined by an in-memory group (barriers; sums in rank order), each running its zig-zag 1/N of
// every packed row with ring attention (models/ring_attention.hpp), give the single-process losses and (their LoRA
// gradients summed, as the trainer's reduction leaves them) its LoRA gradients to 1e-6 of the largest magnitude at
// the first step and 2e-6 at the later ones (cp_harness.hpp's check_close says why), over SGD steps, on rows packing several samples whose boundaries fall inside and across the ranks'
// chunks. The families cover plain RoPE with llama3 scaling and biases (llama), RoPE with q/k norms (qwen3), MoE
// with the router aux loss in the loss (mixtral), sliding-window layers of 3 tokens with sandwich norms (gemma3:
// chunk pairs beyond the window skipped), attention sinks (gpt_oss) and multi-head latent attention with qk 10 /
// v 5 head dims and a shared rope key (deepseek_v3). The multi-process runs over Gloo are in dist_context_test.cpp.
#include <doctest/doctest.h>

#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "models/autograd_ops.hpp"
#include "models/ring_attention.hpp"
#include "models/tiled_mlp.hpp"
#include "ops/aten/register.hpp"
#include "ops/reference/register.hpp"
#include "unit/cp_harness.hpp"

using namespace ax::test::cp;

TEST_CASE("context parallel: N ranks of one group give the single-process losses and LoRA grads to 1e-6 (CPU)") {
  at::set_num_threads(1);
  for (const char* name : {"llama", "qwen3", "mixtral", "gemma3", "gpt_oss", "deepseek_v3"})
    for (bool ckpt : {false, true}) check_family(name, ckpt);
}

// Ring attention against the attention op (reference backend) over the whole rows, on 2 rows of 24 tokens packing
// samples across the chunks: out and dq, dk, dv (and dsinks) of every rank's tokens, GQA with Dv != D, with a
// sliding window, with sinks (differences relative to the larger of 1 and the tensor's largest magnitude). With a
// broken ring (a rank gets its own block back at every step) the same comparison fails. `blocks`: the attention
// backend the ring's blocks run through (the whole rows always run through the reference).
double ring_vs_op(int64_t N, int64_t window, bool sinks, bool broken, at::TensorOptions opts = at::kFloat,
                  const std::string& blocks = "reference") {
  static ax::Registry reg = [] {
    ax::Registry r;
    ax::ops::register_reference_kernels(r);
    ax::ops::register_aten_kernels(r);
    return r;
  }();
  const int64_t B = 2, S = 24, Hq = 4, Hkv = 2, D = 6, Dv = 5;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor q = at::randn({B * S, Hq, D}, gen).to(opts), k = at::randn({B * S, Hkv, D}, gen).to(opts),
                   v = at::randn({B * S, Hkv, Dv}, gen).to(opts);
  const at::Tensor sink = at::randn({Hq}, gen).to(opts.dtype(at::kFloat)), dout = at::randn({B * S, Hq, Dv}, gen).to(opts);
  ax::ops::AttentionArgs a;
  a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 5, 9, 12, 19, 24, 41, 48}, at::kInt).to(opts.device());
  a.max_seqlen = 17;
  a.softmax_scale = 0.7;
  a.window_left = window;
  auto leaves = [&](ax::ops::AttentionArgs& x, const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    x.q = qq.detach().requires_grad_(true);
    x.k = kk.detach().requires_grad_(true);
    x.v = vv.detach().requires_grad_(true);
    if (sinks) x.sinks = sink.detach().requires_grad_(true);
  };
  ax::ops::AttentionArgs whole = a;
  leaves(whole, q, k, v);
  at::Tensor want = ax::autograd::attention(reg.kernel<ax::ops::Attention>("reference"), whole);
  (want * dout).sum().backward();
  Shared shared(N);
  shared.broken_ring = broken;
  std::vector<double> err(static_cast<std::size_t>(N));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(shared, r);
      const ax::models::ContextSplit split{&comm, B, S, ax::models::host_boundaries(a.cu_seqlens.to(at::kCPU))};
      ax::ops::AttentionArgs mine = a;
      // The ring cuts its blocks by the split's host table: the cu_seqlens it is given is never read (a meta tensor).
      mine.cu_seqlens = at::empty({a.cu_seqlens.size(0)}, at::TensorOptions().dtype(at::kInt).device(at::kMeta));
      leaves(mine, split.local(q), split.local(k), split.local(v));
      at::Tensor out, dq, dk, dv, dsinks;
      if (opts.device().is_cuda()) {  // autograd would run every rank's backward node on the device's one thread
        const ax::models::RingGrads g = ax::models::ring_attention_grads(split, mine, split.local(dout), reg.kernel<ax::ops::Attention>(blocks));
        out = g.out, dq = g.dq, dk = g.dk, dv = g.dv, dsinks = g.dsinks;
      } else {
        out = ax::models::ring_attention(split, mine, reg.kernel<ax::ops::Attention>(blocks));
        (out * split.local(dout)).sum().backward();
        dq = mine.q.grad(), dk = mine.k.grad(), dv = mine.v.grad();
        if (sinks) dsinks = mine.sinks.grad();
      }
      double e = 0;  // the largest difference, relative to the larger of 1 and the tensor's largest magnitude
      auto diff = [&](const at::Tensor& x, const at::Tensor& y) {
        const double scale = std::max(1.0, y.abs().max().item<double>());
        e = std::max(e, (x - y).abs().max().item<double>() / scale);
      };
      diff(out, split.local(want));
      diff(dq, split.local(whole.q.grad()));
      diff(dk, split.local(whole.k.grad()));
      diff(dv, split.local(whole.v.grad()));
      err[static_cast<std::size_t>(r)] = e;
      if (sinks) {  // each rank's dsinks is its queries' share: the shares sum to the whole
        at::Tensor g = dsinks.clone();
        comm.all_reduce_sum(g);
        diff(g, whole.sinks.grad());
        err[static_cast<std::size_t>(r)] = e;
      }
    });
  for (auto& t : threads) t.join();
  return *std::max_element(err.begin(), err.end());
}

// ring_vs_op over N = 2, 3, 4 ranks, windows none / 2 / 7 and with or without sinks, each within `tol`.
void check_ring_grid(at::TensorOptions opts, const std::string& blocks, double tol) {
  for (int64_t n : {2, 3, 4})
    for (int64_t window : {-1, 2, 7})
      for (bool sinks : {false, true}) {
        CAPTURE(n);
        CAPTURE(window);
        CAPTURE(sinks);
        CHECK(ring_vs_op(n, window, sinks, false, opts, blocks) <= tol);
      }
}

TEST_CASE("ring attention: every rank's out and gradients are the attention op's over the whole rows") {
  at::set_num_threads(1);
  check_ring_grid(at::kFloat, "reference", 1e-5);
  CHECK(ring_vs_op(2, -1, false, true) > 1e-2);  // the planted bug is seen
}

TEST_CASE("ring attention in bf16 (CPU, and CUDA where there is one): the attention op's out and gradients") {
  at::set_num_threads(1);
  // bf16 inputs, fp32 math on both sides: the outputs differ by their bf16 rounding (the op's bf16 tolerances).
  std::vector<at::Device> devices{at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  else MESSAGE("no CUDA device: the CPU only");
  for (const auto& dev : devices)
    for (int64_t n : {2, 4})
      for (int64_t window : {-1, 2})
        for (bool sinks : {false, true}) {
          CAPTURE(dev);
          CAPTURE(n);
          CAPTURE(window);
          CAPTURE(sinks);
          const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(dev);
          CHECK(ring_vs_op(n, window, sinks, false, opts) <= 3e-2);
          if (n == 2 && window < 0 && !sinks) CHECK(ring_vs_op(n, window, sinks, true, opts) > 1e-1);
        }
}

TEST_CASE("ring attention's blocks through flash (aten, CUDA bf16): the attention op's out and gradients") {
  // The blocks' varlen calls with the keys' own boundaries (docs/ops/attention.md) on flash, against the reference
  // over the whole rows: within the op's bf16 tolerances, as the reference blocks above.
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: the flash path of ring attention's blocks is not run here");
    return;
  }
  at::set_num_threads(1);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
  check_ring_grid(opts, "aten", 3e-2);
  CHECK(ring_vs_op(2, -1, false, true, opts, "aten") > 1e-1);  // the planted bug is seen
}

TEST_CASE("ring attention without autograd (ring_attention_grads, the CUDA tests' path) equals its autograd node bit for bit") {
  at::set_num_threads(1);
  const int64_t N = 3, B = 2, S = 24;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor q = at::randn({B * S, 4, 6}, gen), k = at::randn({B * S, 2, 6}, gen), v = at::randn({B * S, 2, 5}, gen);
  const at::Tensor sink = at::randn({4}, gen), dout = at::randn({B * S, 4, 5}, gen);
  Shared shared(N);
  std::vector<int> same(static_cast<std::size_t>(N), 0);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(shared, r);
      ax::ops::AttentionArgs a;
      a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 5, 9, 12, 19, 24, 41, 48}, at::kInt);
      const ax::models::ContextSplit split{&comm, B, S, ax::models::host_boundaries(a.cu_seqlens)};
      a.max_seqlen = 17;
      a.window_left = 7;
      a.q = split.local(q).requires_grad_(true);
      a.k = split.local(k).requires_grad_(true);
      a.v = split.local(v).requires_grad_(true);
      a.sinks = sink.clone().requires_grad_(true);
      const ax::models::RingGrads g = ax::models::ring_attention_grads(split, a, split.local(dout));
      const at::Tensor out = ax::models::ring_attention(split, a);
      (out * split.local(dout)).sum().backward();
      same[static_cast<std::size_t>(r)] = at::equal(g.out, out) && at::equal(g.dq, a.q.grad()) && at::equal(g.dk, a.k.grad()) &&
                                          at::equal(g.dv, a.v.grad()) && at::equal(g.dsinks, a.sinks.grad());
    });
  for (auto& t : threads) t.join();
  for (int64_t r = 0; r < N; ++r) CHECK(same[static_cast<std::size_t>(r)] == 1);
}

TEST_CASE("ring attention's blocks through the aten backend on the CPU (its reference math) match too") {
  at::set_num_threads(1);
  for (int64_t window : {-1, 7}) {
    CAPTURE(window);
    CHECK(ring_vs_op(3, window, true, false, at::kFloat, "aten") <= 1e-5);
  }
}

TEST_CASE("context parallel: with tiled_mlp, and a forward asked for logits runs whole rows on each rank") {
  at::set_num_threads(1);
  const ax::Batch b = packed_batch("qwen3");
  std::vector<std::unique_ptr<ax::Model>> one;
  one.push_back(load("qwen3", true));
  const Trace want = train(one, b, 2);
  {
    const ax::models::MlpTilesScope tiles(2);
    std::vector<std::unique_ptr<ax::Model>> group;
    for (int r = 0; r < 2; ++r) group.push_back(load("qwen3", true));
    check_close(train(group, b, 2, &want), want);
  }
  // Logits (generation, eval examples) need every position: the forward ignores the split and needs no peer.
  auto m = load("qwen3", false);
  Shared shared(2);
  dynamic_cast<ax::models::DecoderModel&>(*m).set_context_parallel(std::make_shared<ThreadComm>(shared, 0));
  at::NoGradGuard ng;
  auto out = m->forward(b, true);
  CHECK(out.logits.size(1) == 24);
  CHECK(shared.gathers == 0);
}

TEST_CASE("context parallel: a row length 2N does not divide is refused by name") {
  auto m = load("qwen3", false);
  Shared shared(5);
  dynamic_cast<ax::models::DecoderModel&>(*m).set_context_parallel(std::make_shared<ThreadComm>(shared, 0));
  try {
    m->forward(packed_batch("qwen3"), false);
    FAIL("no error");
  } catch (const ax::UsageError& e) {
    CHECK(std::string(e.what()).find("2 x context_parallel = 10 does not divide the row length 24") != std::string::npos);
  }
}
