// Checks the hybrid Gated DeltaNet families share (model_qwen3_5_test.cpp: qwen3_5, qwen3_5_moe;
// model_qwen3_next_test.cpp: qwen3_next; the packing check also model_deepseek_glm_test.cpp), each over a committed case of tests/data/models/ with its peft adapter
// and transformers+peft golden (scripts/goldens/make_model_goldens.py).
#pragma once
#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"

namespace ax::test {

// The model in `dir`, with case `adapter_case`'s peft adapter ("" for none).
inline std::unique_ptr<ax::Model> load_hybrid(const ax::Registry& reg, const std::string& dir,
                                              const std::string& adapter_case = "") {
  ax::ModelLoadOptions o;
  o.dir = dir;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  if (!adapter_case.empty()) o.adapter_dir = (case_dir(adapter_case) / "adapter").string();
  return ax::load_model(reg, o);
}

inline double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

// load_hybrid's UsageError message; "" when it loads.
inline std::string hybrid_load_error(const ax::Registry& reg, const std::filesystem::path& dir) {
  try {
    load_hybrid(reg, dir.string());
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

// The golden's two rows packed into one (cu_seqlens) give `model` the golden's logits and loss; without the
// boundary the second row's logits differ (so the check can fail). Also the group-router families'
// (model_deepseek_glm_test.cpp).
inline void check_packed_golden(ax::Model& model, const std::filesystem::path& dir) {
  auto golden = ax::safetensors::File::open((dir / "golden.safetensors").string());
  const at::Tensor ids = golden->get("input_ids"), labels = golden->get("labels");  // [2, S]
  const int64_t S = ids.size(1);
  ax::Batch b;
  b.input_ids = ids.reshape({1, 2 * S});
  b.labels = labels.reshape({1, 2 * S});
  b.position_ids = at::arange(S, at::kLong).repeat({2}).reshape({1, 2 * S});
  b.cu_seqlens = at::tensor({0, int32_t(S), int32_t(2 * S)}, at::kInt);
  b.max_seqlen = S;
  auto out = model.forward(b, true);
  CHECK(rel_max(out.logits.reshape({2, S, -1}), golden->get("logits")) <= 1e-4);
  CHECK(std::abs(out.loss.item<double>() - golden->get("loss").item<double>()) <= 1e-5 * std::max(1.0, out.loss.item<double>()));
  ax::Batch joined = b;
  joined.position_ids = at::arange(2 * S, at::kLong).reshape({1, 2 * S});
  joined.cu_seqlens = at::Tensor();
  joined.max_seqlen = 0;
  CHECK(rel_max(model.forward(joined, true).logits.reshape({2, S, -1})[1], golden->get("logits")[1]) > 1e-3);
}

// For the hybrid families the recurrent state and the conv window restart at the sample boundary.
inline void check_packed_rows(const std::string& name) {
  CAPTURE(name);
  ax::Registry reg;
  ax::register_builtins(reg);
  auto model = load_hybrid(reg, case_dir(name).string(), name);
  check_packed_golden(*model, case_dir(name));
}

// merge-lora of the case's peft adapter: the merged dir has transformers+peft's logits and the base's tensor
// names and shapes (per-expert experts, fused projections and conv1d.weight [C, 1, W] as stored).
inline void check_merge_lora(const std::string& name) {
  CAPTURE(name);
  ax::Registry reg;
  ax::register_builtins(reg);
  const std::filesystem::path base = case_dir(name);
  const std::filesystem::path out = scratch_dir("merge_" + name) / "merged";
  ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "");
  auto golden = ax::safetensors::File::open((base / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  CHECK(rel_max(load_hybrid(reg, out.string())->forward(b, true).logits, golden->get("logits")) <= 1e-4);
  auto merged = ax::safetensors::Checkpoint::open_dir(out.string());
  auto orig = ax::safetensors::Checkpoint::open_dir(base.string());
  CHECK(merged.names() == orig.names());
  for (const auto& n : orig.names()) CHECK(merged.info(n).shape == orig.info(n).shape);
  remove_tree(out.parent_path());
}

}  // namespace ax::test
