// The gradient all-reduce overlapped with backward (train/dist_reducer.hpp), in this process over a 1-rank
// Gloo group: every collective really runs (c10d, TCPStore), so the hooks, the bucket order, the no_sync
// micro-batches and the parameters without a gradient are checked without spawning ranks. The equality of
// ranks with one process is dist_test.cpp's.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "train/dist_group.hpp"
#include "unit/free_port.hpp"
#include "train/dist_reducer.hpp"

namespace {

int64_t free_port() { return ax::test::free_tcp_port(); }

std::unique_ptr<ax::train::DistGroup> one_rank_group() {
  ax::train::DistEnv env;
  env.launched = true;
  env.master_port = free_port();
  ax::train::DistributedConfig cfg;
  cfg.backend = "gloo";
  cfg.timeout_s = 30;
  return ax::train::DistGroup::join(env, cfg, ax::DeviceInfo{});
}

at::Tensor leaf(at::IntArrayRef sizes, double scale) {
  return (at::arange(at::IntArrayRef(sizes).size() == 1 ? sizes[0] : sizes[0] * sizes[1], at::kFloat).reshape(sizes) * scale + 0.25)
      .requires_grad_(true);
}

}  // namespace

TEST_CASE("distributed: the gradient all-reduce starts during backward, in bucket order, with unused parameters as zeros") {
  auto group = one_rank_group();
  // Registered in forward order: `unused` first (no gradient in the step), then w1 -> w2 -> w3 as the
  // forward uses them. One parameter a bucket (16 bytes each); the buckets start last first.
  at::Tensor unused = leaf({4}, 1.0), w1 = leaf({4}, 0.5), w2 = leaf({2, 2}, -0.25), w3 = leaf({4}, 0.125);
  ax::train::GradReducer r(*group, {unused, w1, w2, w3}, 16);
  CHECK(r.buckets() == 4);
  const at::Tensor x = at::linspace(-1, 1, 4, at::kFloat);
  // An observation point inside backward: the gradient of x * w1 is computed after w3's and w2's are final
  // and before w1's, so the buckets started by then were started while backward was still running.
  int64_t seen_mid_backward = -1;
  auto loss_of = [&] {
    at::Tensor h1 = x * w1;
    h1.register_hook([&](const at::Tensor&) { seen_mid_backward = r.launched_in_backward(); });
    return (h1.tanh() * w2.reshape({4})).sin().mul(w3).sum();
  };

  // The reference gradients, by plain autograd on copies without hooks.
  at::Tensor c1 = w1.detach().clone().requires_grad_(true), c2 = w2.detach().clone().requires_grad_(true),
             c3 = w3.detach().clone().requires_grad_(true);
  ((x * c1).tanh() * c2.reshape({4})).sin().mul(c3).sum().backward();

  SUBCASE("one micro-batch") {
    r.arm(true);
    loss_of().backward();
    // w3, w2 and w1 became final inside backward, in launch order (buckets 3, 2, 1): all three started
    // before backward returned. Bucket 0 (`unused`) has no gradient: it starts in finish().
    CHECK(seen_mid_backward == 2);
    CHECK(r.launched_in_backward() == 3);
    CHECK(!unused.grad().defined());
    r.finish();
    CHECK(at::equal(w1.grad(), c1.grad()));
    CHECK(at::equal(w2.grad(), c2.grad()));
    CHECK(at::equal(w3.grad(), c3.grad()));
    CHECK(at::equal(unused.grad(), at::zeros({4})));  // takes part as zeros, as on a rank no token reached
  }
  SUBCASE("an accumulation window: only its last backward communicates") {
    r.arm(false);
    loss_of().backward();
    CHECK(seen_mid_backward == 0);  // the first backward started nothing
    r.arm(true);
    loss_of().backward();
    CHECK(seen_mid_backward == 2);
    CHECK(r.launched_in_backward() == 3);
    r.finish();
    CHECK(at::equal(w1.grad(), c1.grad() * 2));
    CHECK(at::equal(w3.grad(), c3.grad() * 2));
    CHECK(at::equal(unused.grad(), at::zeros({4})));
  }
  SUBCASE("a parameter whose gradient came only from an earlier micro-batch holds up the buckets after it") {
    // The last micro-batch does not reach w3: its gradient (from the first) is final only once backward
    // ends, and bucket 3 is the first to start, so nothing starts inside backward; finish() sends them all.
    r.arm(false);
    loss_of().backward();
    r.arm(true);
    ((x * w1).tanh() * w2.reshape({4})).sin().sum().backward();
    CHECK(r.launched_in_backward() == 0);
    r.finish();
    CHECK(at::equal(w3.grad(), c3.grad()));
    CHECK(w1.grad().defined());
  }
  SUBCASE("gradients zeroed in place between steps (an optimizer that keeps them) accumulate into the buckets") {
    r.arm(true);
    loss_of().backward();
    r.finish();
    for (auto* p : {&unused, &w1, &w2, &w3}) p->mutable_grad().zero_();  // still the views finish() set
    r.arm(true);
    loss_of().backward();
    CHECK(r.launched_in_backward() == 3);
    r.finish();
    CHECK(at::equal(w1.grad(), c1.grad()));
    CHECK(at::equal(w2.grad(), c2.grad()));
    CHECK(at::equal(unused.grad(), at::zeros({4})));
  }
  SUBCASE("a gradient that arrives twice in one armed step is refused") {
    r.arm(true);
    loss_of().backward();
    CHECK_THROWS_WITH_AS(r.on_grad(1), "GradReducer: parameter 1 got its gradient twice in one backward", std::runtime_error);
  }
}

TEST_CASE("distributed: the gradient reducer's hooks go with it") {
  auto group = one_rank_group();
  at::Tensor w = leaf({4}, 1.0);
  {
    ax::train::GradReducer r(*group, {w}, 1 << 20);
    r.arm(true);
    w.mul(2).sum().backward();
    CHECK(r.launched_in_backward() == 1);
    r.finish();
  }
  w.mutable_grad() = at::Tensor();
  w.mul(2).sum().backward();  // no hook left to call a destroyed reducer
  CHECK(at::equal(w.grad(), at::full({4}, 2.0f)));
}
