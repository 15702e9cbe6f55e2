// What the vision-language parity tests share (model_qwen2_5_vl_test.cpp, model_qwen3_vl_test.cpp,
// model_qwen3_vl_moe_test.cpp): the goldens
// of scripts/goldens/make_vlm_goldens.py (three samples: two images; one or two images; text only) packed into
// two rows, and the tolerances' measures.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include "axengine/builtins.hpp"
#include "axengine/device.hpp"
#include "axengine/model.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "models/register.hpp"
#include "unit/model_test_backends.hpp"

namespace ax::test::vl {

struct Loaded {
  std::unique_ptr<ax::Registry> registry;
  std::unique_ptr<ax::Model> model;
  template <class M>
  M& as() { return dynamic_cast<M&>(*model); }
};

// The model of `dir` on the CPU with the "reference" backends (register_builtins) or the "naive" ones, with a
// saved adapter or a new LoRA.
inline Loaded load(const std::string& dir, const std::string& backends, const std::string& adapter,
                   std::optional<ax::LoraSpec> spec = std::nullopt) {
  Loaded l;
  l.registry = std::make_unique<ax::Registry>();
  if (backends == "naive") {
    ax::test::add_naive_backends(*l.registry);
    ax::models::register_builtin_models(*l.registry);
  } else {
    ax::register_builtins(*l.registry);
  }
  ax::ModelLoadOptions o;
  o.dir = dir;
  o.kernels = std::make_shared<ax::KernelSet>(*l.registry, ax::KernelPreferences{}, ax::DeviceInfo{});
  o.adapter_dir = adapter;
  o.lora = std::move(spec);
  l.model = ax::load_model(*l.registry, o);
  return l;
}

inline double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}
inline double rel_norm(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-12, b.norm().item<double>());
}

// Row 0: sample 0. Row 1: sample 1, sample 2 (text only), padding. The spans and positions make_batch gives
// them; the images' extras concatenated in token order.
struct Packed {
  ax::Batch batch;
  std::vector<std::array<int64_t, 3>> where;  // sample k: row, offset, length
};
inline Packed packed_batch(const ax::safetensors::File& g) {
  const int64_t S = g.get("ids.0").size(0);
  Packed p;
  p.where = {{0, 0, S}, {1, 0, g.get("ids.1").size(0)}, {1, g.get("ids.1").size(0), g.get("ids.2").size(0)}};
  at::Tensor ids = at::zeros({2, S}, at::kLong), labels = at::full({2, S}, -100, at::kLong), pos = at::zeros({2, S}, at::kLong);
  std::vector<int32_t> cu{0};
  for (int k = 0; k < 3; ++k) {
    auto [row, off, len] = p.where[k];
    ids[row].narrow(0, off, len).copy_(g.get(ax::str("ids.", k)));
    labels[row].narrow(0, off, len).copy_(g.get(ax::str("labels.", k)));
    pos[row].narrow(0, off, len).copy_(at::arange(len, at::kLong));
    cu.push_back(static_cast<int32_t>(row * S + off + len));
  }
  const int64_t pad_off = p.where[2][1] + p.where[2][2];
  REQUIRE(pad_off < S);  // the padding span below is not empty
  pos[1].narrow(0, pad_off, S - pad_off).copy_(at::arange(S - pad_off, at::kLong));
  cu.push_back(static_cast<int32_t>(2 * S));
  ax::Batch& b = p.batch;
  b.input_ids = ids;
  b.labels = labels;
  b.position_ids = pos;
  b.cu_seqlens = at::tensor(cu, at::kInt);
  b.cu_seqlens_host = b.cu_seqlens;
  b.max_seqlen = S;
  b.extras["pixel_values"] = at::cat({g.get("pixel_values.0"), g.get("pixel_values.1")});
  b.extras["image_grid_thw"] = at::cat({g.get("grid.0"), g.get("grid.1")});
  return p;
}

inline void check_logits(const at::Tensor& logits, const Packed& p, const ax::safetensors::File& g) {
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    auto [row, off, len] = p.where[k];
    CHECK(rel_max(logits[row].narrow(0, off, len), g.get(ax::str("logits.", k))) <= 1e-4);
  }
}

// The loss and every LoRA factor's gradient of `modules` against the golden's (grad.<peft key>.lora_A.weight, ...):
// returns how many factors were compared, all of the golden's.
template <class Modules>
int check_loss_and_grads(const ax::ModelOutput& out, const Modules& modules, const ax::safetensors::File& g) {
  const double want = g.get("loss").item<double>();
  CHECK(std::abs(out.loss.item<double>() - want) <= 1e-5 * std::max(1.0, want));
  out.loss.backward();
  int checked = 0;
  for (const auto& m : modules) {
    CAPTURE(m.peft_key);
    REQUIRE(m.a.grad().defined());
    at::Tensor ga = m.a.grad().to(at::kCPU), gb = m.b.grad().to(at::kCPU);
    if (m.site.experts) {  // to peft's lora_B column order (j·E + e): qwen3_vl_moe's fused experts
      const int64_t E = m.site.num_experts;
      gb = gb.view({gb.size(0), E, m.r}).permute({0, 2, 1}).reshape({gb.size(0), m.r * E});
    }
    CHECK(rel_norm(ga, g.get("grad." + m.peft_key + ".lora_A.weight")) <= 1e-4);
    CHECK(rel_norm(gb, g.get("grad." + m.peft_key + ".lora_B.weight")) <= 1e-4);
    checked += 2;
  }
  int golden_grads = 0;
  for (const auto& t : g.tensors()) golden_grads += t.name.rfind("grad.", 0) == 0;
  CHECK(checked == golden_grads);
  return checked;
}

// `steps` plain SGD steps (lr 0.05) of `model`'s trainable parameters on `p`: the first and the last step's loss.
inline std::pair<double, double> sgd_losses(ax::Model& model, const Packed& p, int steps) {
  std::vector<at::Tensor> params;
  for (const auto& [n, t] : model.trainable_parameters()) params.push_back(t);
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    auto out = model.forward(p.batch, false);
    for (auto& t : params) t.mutable_grad() = at::Tensor();
    out.loss.backward();
    at::NoGradGuard ng;
    for (auto& t : params) t.sub_(t.grad() * 0.05);
    (step == 0 ? first : last) = out.loss.item<double>();
  }
  return {first, last};
}

// For tests/python/check_vlm_peft.py: each sample's ids, images and our `logits` (of the packed batch) in
// dir/expected.safetensors, the base model's dir in dir/base_dir.txt.
inline void write_peft_check(const std::filesystem::path& dir, const Packed& p, const at::Tensor& logits,
                             const ax::safetensors::File& g, const std::string& base_dir) {
  std::vector<std::pair<std::string, at::Tensor>> expected;
  for (int k = 0; k < 3; ++k) {
    auto [row, off, len] = p.where[k];
    expected.emplace_back(ax::str("ids.", k), g.get(ax::str("ids.", k)));
    expected.emplace_back(ax::str("logits.", k), logits[row].narrow(0, off, len).contiguous());
    if (g.find(ax::str("grid.", k))) {
      expected.emplace_back(ax::str("pixel_values.", k), g.get(ax::str("pixel_values.", k)));
      expected.emplace_back(ax::str("grid.", k), g.get(ax::str("grid.", k)));
    }
  }
  ax::safetensors::save((dir / "expected.safetensors").string(), expected);
  std::ofstream(dir / "base_dir.txt") << base_dir;
}

}  // namespace ax::test::vl
