// The group-limited sigmoid router of DeepSeek-V3 / GLM-4.5 (models/parts/group_topk_router.hpp) against
// transformers' own router modules: scripts/goldens/make_group_router_goldens.py (fp32, autograd).
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <string>

#include "axengine/error.hpp"
#include "models/parts/group_topk_router.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::models;

namespace {

GroupTopkRouting routing_of(std::map<std::string, at::Tensor>& g, const std::string& m) {
  at::Tensor c = g[m + "_config"];
  GroupTopkRouting r;
  r.n_group = c[0].item<int64_t>();
  r.topk_group = c[1].item<int64_t>();
  r.top_k = c[2].item<int64_t>();
  r.norm_topk_prob = c[3].item<int64_t>() != 0;
  r.routed_scaling_factor = g[m + "_scaling"][0].item<double>();
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

}  // namespace

TEST_CASE("group router: choice, weights and gradients equal transformers' (DeepSeek-V3 groups, GLM-4.5 one group)") {
  auto g = test::load_safetensors(test::data_path("models/group_router.safetensors"));
  for (std::string m : {"deepseek_v3", "glm4_moe"}) {
    CAPTURE(m);
    const GroupTopkRouting r = routing_of(g, m);
    at::Tensor x = g[m + "_x"].clone().requires_grad_(true);
    at::Tensor w = g[m + "_weight"].clone().requires_grad_(true);
    at::Tensor bias = g[m + "_bias"];
    GroupTopkChoice c = group_topk_route(x, w, bias, r);
    CHECK(test::rel_err(c.logits, g[m + "_logits"]) < 1e-6);
    // Same experts per row (the order within a row is free): compare sorted, the weights following.
    auto [got_i, got_p] = c.indices.sort(-1);
    auto [want_i, want_p] = g[m + "_indices"].sort(-1);
    REQUIRE(at::equal(got_i, want_i));
    CHECK(test::rel_err(c.weights.gather(1, got_p), g[m + "_weights"].gather(1, want_p)) < 1e-6);
    at::Tensor loss = (g[m + "_grad_dense"].gather(1, c.indices) * c.weights).sum();
    auto grads = torch::autograd::grad({loss}, {x, w});
    CHECK(test::rel_err(grads[0], g[m + "_dx"]) < 1e-5);
    CHECK(test::rel_err(grads[1], g[m + "_dweight"]) < 1e-5);
    // The bias steers the choice only: without it other experts are chosen, and it never scales a weight.
    GroupTopkChoice plain = group_topk_route(x, w, at::Tensor(), r);
    CHECK_FALSE(at::equal(std::get<0>(plain.indices.sort(-1)), got_i));
    at::Tensor s = at::sigmoid(c.logits).gather(1, c.indices);
    if (r.norm_topk_prob) s = s / s.sum(-1, true);
    CHECK(test::rel_err(c.weights, s * r.routed_scaling_factor) < 1e-6);
  }
}

TEST_CASE("group router: settings that cannot route are refused naming the key") {
  auto check = [](GroupTopkRouting r, int64_t E) { check_group_topk(r, E, "config.json"); };
  check({.n_group = 8, .topk_group = 4, .top_k = 8}, 256);  // DeepSeek-V3's own
  check({.n_group = 1, .topk_group = 1, .top_k = 8}, 384);  // Kimi K2's
  CHECK(error_of([&] { check({.n_group = 3, .topk_group = 1, .top_k = 2}, 32); })
            .find("config.json: n_group: 3 does not divide n_routed_experts 32") != std::string::npos);
  CHECK(error_of([&] { check({.n_group = 8, .topk_group = 9, .top_k = 2}, 32); })
            .find("config.json: topk_group: must be in [1, n_group = 8], got 9") != std::string::npos);
  CHECK(error_of([&] { check({.n_group = 8, .topk_group = 2, .top_k = 9}, 32); })
            .find("config.json: num_experts_per_tok: must be in [1, 8]") != std::string::npos);
  CHECK(error_of([&] { check({.n_group = 16, .topk_group = 2, .top_k = 2}, 16); })
            .find("config.json: n_group: 16 groups of 16 experts leave fewer than 2") != std::string::npos);
  CHECK(error_of([&] { check({.n_group = 0, .topk_group = 1, .top_k = 1}, 16); }).find("n_group: must be >= 1") !=
        std::string::npos);
}
