// Expert parallelism's dispatch on c10d's Gloo backend with two real processes: each rank holds half the
// experts and its own tokens; the outputs and every gradient (x, gates, the local experts' LoRA factors) equal
// one process's moe.mlp over the concatenated tokens with all experts, also when one rank receives no rows
// (empty all-to-all splits). The test case re-runs this executable
// as the two ranks (AXENGINE_EP_TEST_RANK set), so one CTest entry drives and checks both.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "axengine/builtins.hpp"
#include "axengine/device.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/registry.hpp"
#include "models/autograd_ops.hpp"
#include "models/expert_parallel.hpp"
#include "train/dist_expert.hpp"
#include "train/dist_group.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

namespace {

constexpr const char* kCase = "expert parallel: 2 Gloo ranks' all-to-all dispatch equals one process's moe.mlp";

// The problem both ranks and the single-process reference build from one seed: E experts, k slots, T tokens
// per rank (2T in all), some slots -1 (the sentinel: contributes nothing, wherever it sits).
constexpr int64_t E = 4, k = 2, T = 7, H = 8, I = 6, r = 2;

struct Problem {
  at::Tensor x, gates, top_i, w_up, w_down, b_up, b_down, a1, b1, a2, b2, grad_y;
};

// skewed: every token routes to rank 0's experts only, so rank 1 receives no rows (empty all-to-all splits).
Problem make_problem(bool skewed) {
  at::manual_seed(1234);
  const auto f = at::TensorOptions().dtype(at::kFloat);
  Problem p;
  p.x = at::randn({2 * T, H}, f);
  p.gates = at::softmax(at::randn({2 * T, k}, f), -1);
  p.top_i = std::get<1>(at::topk(at::rand({2 * T, skewed ? E / 2 : E}, f), k, -1));
  p.top_i.index_put_({3, 1}, -1);  // one slot inactive on rank 0's tokens, a whole token on rank 1's
  p.top_i.index_put_({T + 2}, -1);
  p.w_up = at::randn({E, 2 * I, H}, f) * 0.3;
  p.w_down = at::randn({E, H, I}, f) * 0.3;
  p.b_up = at::randn({E, 2 * I}, f) * 0.1;
  p.b_down = at::randn({E, H}, f) * 0.1;
  p.a1 = at::randn({r * E, H}, f) * 0.2;
  p.b1 = at::randn({2 * I, r * E}, f) * 0.2;
  p.a2 = at::randn({r * E, I}, f) * 0.2;
  p.b2 = at::randn({H, r * E}, f) * 0.2;
  p.grad_y = at::randn({2 * T, H}, f);
  return p;
}

// moe.experts' routing of top_i [T, k] over `experts`: sorted by expert, the -1 slots after the last offset.
ax::ops::MoeRouting routing_of(const at::Tensor& top_i, int64_t experts) {
  at::Tensor flat = top_i.reshape({-1});
  at::Tensor key = at::where(flat >= 0, flat, at::full_like(flat, experts));
  auto [sorted, perm] = key.sort(true, 0, false);
  ax::ops::MoeRouting out;
  out.sorted_expert_idxs = at::where(sorted == experts, at::full_like(sorted, -1), sorted);
  out.sorted_scattered_idxs = perm;
  out.expert_offsets = at::zeros({experts}, at::kLong).scatter_add_(0, at::clamp_max(key, experts - 1), (key < experts).to(at::kLong)).cumsum(0);
  out.top_k = top_i.size(1);
  return out;
}

struct Leaves {
  at::Tensor x, gates, a1, b1, a2, b2;
};

// The moe.mlp args over expert range [e0, e0 + n) and token rows [t0, t0 + m), with fresh leaves requiring grad.
ax::ops::MoeMlpArgs args_of(const Problem& p, int64_t e0, int64_t n, int64_t t0, int64_t m, Leaves& leaves) {
  auto leaf = [](const at::Tensor& t) { return t.clone().requires_grad_(true); };
  leaves.x = leaf(p.x.narrow(0, t0, m));
  leaves.gates = leaf(p.gates.narrow(0, t0, m));
  leaves.a1 = leaf(p.a1.narrow(0, e0 * r, n * r));
  leaves.b1 = leaf(p.b1.narrow(1, e0 * r, n * r));
  leaves.a2 = leaf(p.a2.narrow(0, e0 * r, n * r));
  leaves.b2 = leaf(p.b2.narrow(1, e0 * r, n * r));
  ax::ops::MoeMlpArgs a;
  a.x = leaves.x;
  a.gates = leaves.gates;
  a.gate_up = ax::ops::WeightTensor::dense(p.w_up.narrow(0, e0, n).contiguous());
  a.down = ax::ops::WeightTensor::dense(p.w_down.narrow(0, e0, n).contiguous());
  a.layout = ax::ops::ExpertLayout::ENK;
  a.gate_up_bias = p.b_up.narrow(0, e0, n).contiguous();
  a.down_bias = p.b_down.narrow(0, e0, n).contiguous();
  a.gate_up_lora = {leaves.a1, leaves.b1, 0.5};
  a.down_lora = {leaves.a2, leaves.b2, 0.25};
  return a;
}

// A leaf's gradient; zeros where backward never reached it (an expert no token was routed to).
at::Tensor grad_of(const at::Tensor& leaf) { return leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf); }

void check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want) {
  CAPTURE(what);
  REQUIRE(got.defined());
  REQUIRE(got.sizes() == want.sizes());
  const double scale = std::max(1e-6, want.abs().max().item<double>());
  CHECK((got - want).abs().max().item<double>() / scale < 1e-5);
}

// One rank: the dispatch over this rank's experts and tokens, against the reference over everything.
void check_rank(ax::train::ExpertParallelGroups& ep, const std::shared_ptr<ax::ops::MoeMlp>& op, int64_t rank, bool skewed) {
  CAPTURE(skewed);
  const Problem p = make_problem(skewed);

  // Reference: one process, all experts, both ranks' tokens; the loss <y, grad_y>.
  Leaves ref;
  ax::ops::MoeMlpArgs ra = args_of(p, 0, E, 0, 2 * T, ref);
  ra.routing = routing_of(p.top_i, E);
  at::Tensor y_ref = ax::autograd::moe_mlp(op, std::move(ra));
  (y_ref * p.grad_y).sum().backward();

  const int64_t El = E / 2, e0 = rank * El, t0 = rank * T;
  Leaves mine;
  ax::ops::MoeMlpArgs a = args_of(p, e0, El, t0, T, mine);
  a.routing = routing_of(p.top_i.narrow(0, t0, T), E);  // global expert ids: the dispatch makes them local
  at::Tensor y = ax::models::expert_parallel_mlp(*ep.comm, op, std::move(a), E);
  (y * p.grad_y.narrow(0, t0, T)).sum().backward();

  check_close("y", y, y_ref.detach().narrow(0, t0, T));
  check_close("dx", mine.x.grad(), ref.x.grad().narrow(0, t0, T));
  check_close("dgates", mine.gates.grad(), ref.gates.grad().narrow(0, t0, T));
  // This rank's experts' LoRA gradients: every token of both ranks that reached them (the reverse all-to-all
  // brought their gradients here), as one process over the concatenated tokens computes them.
  check_close("d gate_up lora_A", grad_of(mine.a1), ref.a1.grad().narrow(0, e0 * r, El * r));
  check_close("d gate_up lora_B", grad_of(mine.b1), ref.b1.grad().narrow(1, e0 * r, El * r));
  check_close("d down lora_A", grad_of(mine.a2), ref.a2.grad().narrow(0, e0 * r, El * r));
  check_close("d down lora_B", grad_of(mine.b2), ref.b2.grad().narrow(1, e0 * r, El * r));
  // The inactive slot and the token without any expert: no gradient, exactly; the latter's row is exactly 0.
  if (rank == 0) CHECK(mine.gates.grad()[3][1].item<float>() == 0.0f);
  if (rank == 1) CHECK(y[2].abs().max().item<float>() == 0.0f);
  // A gathered adapter factor is the full one in expert order.
  check_close("gathered lora_A", ep.comm->all_gather(mine.a1.detach()), p.a1);
  if (skewed && rank == 1) CHECK(!mine.a1.grad().defined());  // no token reached its experts: no LoRA gradient
}

void worker(int64_t rank) {
  ax::Registry registry;
  ax::register_builtins(registry);
  auto op = std::static_pointer_cast<ax::ops::MoeMlp>(registry.find(ax::ProviderKind::kernel, ax::ops::MoeMlp::kOp, "reference")->object);
  at::set_num_threads(1);
  ax::train::DistributedConfig dc;
  dc.backend = "gloo";
  dc.timeout_s = 60;
  auto world = ax::train::DistGroup::join(ax::train::read_dist_env(), dc, ax::DeviceInfo{});
  auto ep = ax::train::make_expert_parallel(*world, 2);
  REQUIRE(ep.comm->rank() == rank);
  REQUIRE(ep.comm->size() == 2);
  CHECK(ep.replicas->world() == 1);
  check_rank(ep, op, rank, false);
  check_rank(ep, op, rank, true);
  world->barrier();
}

}  // namespace

TEST_CASE(kCase) {
  if (const char* r = std::getenv("AXENGINE_EP_TEST_RANK")) {
    worker(std::atoll(r));
    return;
  }
  // The driver: this executable again, once per rank, with torchrun's variables.
  auto dir = ax::test::scratch_dir("ep_dispatch");
  const std::string port = std::to_string(29800 + ::getpid() % 97);
  std::vector<pid_t> pids;
  std::fflush(nullptr);  // a child must not write out the parent's buffered output
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      const std::string log = (dir / ("rank" + std::to_string(rank) + ".log")).string();
      FILE* f = std::freopen(log.c_str(), "w", stdout);
      if (!f || ::dup2(::fileno(stdout), 2) < 0) ::_exit(126);
      ::setenv("AXENGINE_EP_TEST_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", "2", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      const std::string filter = std::string("--test-case=") + kCase;
      char* argv[] = {const_cast<char*>("/proc/self/exe"), const_cast<char*>(filter.c_str()), nullptr};
      ::execv("/proc/self/exe", argv);
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok)
    for (int rank = 0; rank < 2; ++rank) MESSAGE("rank ", rank, ":\n", ax::test::slurp(dir / ("rank" + std::to_string(rank) + ".log")));
  CHECK(ok);
  ax::test::remove_tree(dir);
}
