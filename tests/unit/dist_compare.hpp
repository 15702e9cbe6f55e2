// Comparing a distributed run with one process accumulating the same micro-batches: the losses of metrics.jsonl
// and the final adapter (tests/unit/dist_test.cpp, dist_multinode_test.cpp).
#pragma once
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include "axengine/safetensors.hpp"
#include "unit/cli_util.hpp"

namespace ax::test {

inline std::vector<double> losses(const std::filesystem::path& out) {
  std::vector<double> v;
  for (const auto& r : step_records(out / "metrics.jsonl")) v.push_back(r["loss"].get<double>());
  return v;
}

// Loss by loss within fp32 round-off (the sums of the ranks' gradients run in another order than one
// process accumulating them).
inline void check_same_losses(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

// The final adapters, tensor by tensor, within fp32 round-off (AdamW's normalisation magnifies the last bits of
// tiny gradients a little: relative to the tensor's scale, not element by element). The bound is 2e-3: a lora_B
// (zero at the start, so its scale after 4 steps is a few learning rates) differed by 5.6e-4 of its scale
// between a 3-rank and a grad_accum-3 run on the 16-core Xeon of the GPU host (1e-4 held on this CI's CPU); a
// wrong sample order or gradient average differs by O(1) of the scale.
inline void check_same_adapter(const std::filesystem::path& got_out, const std::filesystem::path& want_out, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  auto got = ax::safetensors::File::open((got_out / "checkpoints" / name / "adapter_model.safetensors").string());
  auto want = ax::safetensors::File::open((want_out / "checkpoints" / name / "adapter_model.safetensors").string());
  REQUIRE(got->tensors().size() == want->tensors().size());
  for (const auto& info : want->tensors()) {
    CAPTURE(info.name);
    at::Tensor a = got->get(info.name).to(at::kFloat), b = want->get(info.name).to(at::kFloat);
    REQUIRE(a.sizes() == b.sizes());
    const double scale = std::max(1e-6, b.abs().max().item<double>());
    CHECK((a - b).abs().max().item<double>() / scale < 2e-3);
  }
}

}  // namespace ax::test
