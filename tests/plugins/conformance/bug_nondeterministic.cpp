// Planted bug: dA and dB accumulated in a different order on every call, as unordered atomics would do
// on a GPU. On the CPU: the active routing entries are split into randomly chosen chunks, each chunk's
// contribution is taken from the reference (the other entries masked to -1), and the partial sums are
// added in a random order. Values stay within tolerance; bits differ from run to run.
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_nondeterministic", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "moe.experts", "name": "bug_nondeterministic",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32"], "formats": ["dense"], "layouts": ["EKN"]}}]
})")

namespace {
struct Bug : axtest::MoeWrap {
  ax::ops::MoeExpertsGrads run_backward(const ax::ops::MoeExpertsArgs& a, const ax::ops::MoeExpertsBackwardArgs& b) override {
    ax::ops::MoeExpertsGrads g = MoeWrap::run_backward(a, b);
    if (!a.lora_a.defined() || !b.need_dlora) return g;
    auto ref = axtest::reference<ax::ops::MoeExperts>();
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    const int64_t M = a.routing.sorted_expert_idxs.size(0);
    const int64_t chunks = 4;
    at::Tensor chunk_of = at::empty({M}, at::kLong);
    for (int64_t p = 0; p < M; ++p) chunk_of[p] = static_cast<int64_t>(rng() % chunks);
    chunk_of = chunk_of.to(a.routing.sorted_expert_idxs.device());
    std::vector<at::Tensor> da, db;
    for (int64_t c = 0; c < chunks; ++c) {
      ax::ops::MoeExpertsArgs part = a;
      part.routing.sorted_expert_idxs = a.routing.sorted_expert_idxs.masked_fill(chunk_of != c, -1);
      ax::ops::MoeExpertsBackwardArgs pb;
      pb.grad_y = b.grad_y;
      pb.saved = ref->forward(part).saved;
      pb.need_dx = false;
      pb.need_dgates = false;
      auto pg = ref->backward(part, pb);
      da.push_back(pg.dlora_a.to(at::kFloat));
      db.push_back(pg.dlora_b.to(at::kFloat));
    }
    std::vector<int> order(chunks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    at::Tensor sa = at::zeros_like(da[0]), sb = at::zeros_like(db[0]);
    for (int c : order) {
      sa += da[c];
      sb += db[c];
    }
    g.dlora_a.copy_(sa);
    g.dlora_b.copy_(sb);
    return g;
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeExperts>("bug_nondeterministic", std::make_shared<Bug>()); }
