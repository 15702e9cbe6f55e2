// What the vision-language parity tests share (model_qwen2_5_vl_test.cpp, model_qwen3_vl_test.cpp,
// model_qwen3_vl_moe_test.cpp, model_gemma3_mm_test.cpp): the goldens of scripts/goldens/make_vlm_goldens.py / make_gemma3_mm_goldens.py
// (three samples: two images; one or two images; text only) packed into two rows, the tolerances' measures, and
// the cases every family runs: adapter round trip, a few training steps, merge-lora against transformers + peft.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
#include "models/decoder.hpp"
#include "models/register.hpp"
#include "models/vlm.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"

namespace ax::test::vl {

struct Loaded {
  std::unique_ptr<ax::Registry> registry;
  std::unique_ptr<ax::Model> model;
  template <class M>
  M& as() { return dynamic_cast<M&>(*model); }
};

// The model of `dir` on `device` (fp32) with the "reference" backends (register_builtins; on a GPU the
// reference ops preferred) or the "naive" ones, with a saved adapter or a new LoRA.
inline Loaded load(const std::string& dir, const std::string& backends, const std::string& adapter,
                   std::optional<ax::LoraSpec> spec = std::nullopt, const std::string& device = "cpu") {
  Loaded l;
  l.registry = std::make_unique<ax::Registry>();
  ax::KernelPreferences prefs;
  if (backends == "naive") {
    ax::test::add_naive_backends(*l.registry);
    ax::models::register_builtin_models(*l.registry);
  } else {
    ax::register_builtins(*l.registry);
    if (device != "cpu")
      for (const char* op : {"linear.lora", "attention", "rms_norm", "swiglu", "norm_rope", "linear_ce"}) prefs.prefer[op] = {"reference"};
  }
  ax::ModelLoadOptions o;
  o.dir = dir;
  o.device = device;
  o.dtype = "fp32";
  o.kernels = std::make_shared<ax::KernelSet>(*l.registry, prefs, device == "cpu" ? ax::DeviceInfo{} : ax::detect_device("cuda"));
  o.adapter_dir = adapter;
  o.lora = std::move(spec);
  l.model = ax::load_model(*l.registry, o);
  return l;
}

inline double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kCPU) - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}
inline double rel_norm(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-12, b.norm().item<double>());
}

// Row 0: sample 0, padding. Row 1: sample 1, sample 2 (text only), padding. Rows of `S` tokens (0: as long as
// sample 0); each padding span restarts its positions. The images' extras (pixel_values, and image_grid_thw
// where the golden has grids) concatenated in token order.
struct Packed {
  ax::Batch batch;
  std::vector<std::array<int64_t, 3>> where;  // sample k: row, offset, length
};
inline Packed packed_batch(const ax::safetensors::File& g, int64_t S = 0) {
  const int64_t n0 = g.get("ids.0").size(0), n1 = g.get("ids.1").size(0), n2 = g.get("ids.2").size(0);
  if (S == 0) S = n0;
  REQUIRE(S >= n0);
  REQUIRE(n1 + n2 < S);  // row 1's padding span is not empty
  Packed p;
  p.where = {{0, 0, n0}, {1, 0, n1}, {1, n1, n2}};
  at::Tensor ids = at::zeros({2, S}, at::kLong), labels = at::full({2, S}, -100, at::kLong), pos = at::zeros({2, S}, at::kLong);
  for (int k = 0; k < 3; ++k) {
    auto [row, off, len] = p.where[k];
    ids[row].narrow(0, off, len).copy_(g.get(ax::str("ids.", k)));
    labels[row].narrow(0, off, len).copy_(g.get(ax::str("labels.", k)));
    pos[row].narrow(0, off, len).copy_(at::arange(len, at::kLong));
  }
  pos[0].narrow(0, n0, S - n0).copy_(at::arange(S - n0, at::kLong));
  pos[1].narrow(0, n1 + n2, S - n1 - n2).copy_(at::arange(S - n1 - n2, at::kLong));
  std::vector<int32_t> cu{0, static_cast<int32_t>(n0)};
  if (n0 < S) cu.push_back(static_cast<int32_t>(S));
  for (int64_t end : {S + n1, S + n1 + n2, 2 * S}) cu.push_back(static_cast<int32_t>(end));
  ax::Batch& b = p.batch;
  b.input_ids = ids;
  b.labels = labels;
  b.position_ids = pos;
  b.cu_seqlens = at::tensor(cu, at::kInt);
  b.cu_seqlens_host = b.cu_seqlens;
  b.max_seqlen = S;
  b.extras["pixel_values"] = at::cat({g.get("pixel_values.0"), g.get("pixel_values.1")});
  if (g.find("grid.0")) b.extras["image_grid_thw"] = at::cat({g.get("grid.0"), g.get("grid.1")});
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

// The parity case: logits, loss and every LoRA gradient against the golden; returns how many factors.
inline int check_parity(const std::string& dir, const std::string& backends, const Packed& p, const ax::safetensors::File& g) {
  CAPTURE(backends);
  auto l = load(dir, backends, dir + "/adapter");
  auto out = l.model->forward(p.batch, true);
  check_logits(out.logits, p, g);
  return check_loss_and_grads(out, l.as<ax::models::VlModel>().text().lora().modules, g);
}

// For tests/python/check_vlm_peft.py, in `out`: the samples (ids; pixel_values and grid where they have images) with
// our logits of each from the packed batch (expected.safetensors), and the base model's dir (base_dir.txt).
inline void export_for_peft(const std::filesystem::path& out, const std::string& dir, const Packed& p, const ax::safetensors::File& g,
                            const at::Tensor& logits) {
  std::vector<std::pair<std::string, at::Tensor>> expected;  // peft's logits of each sample alone against ours
  for (int k = 0; k < 3; ++k) {
    auto [row, off, len] = p.where[k];
    expected.emplace_back(ax::str("ids.", k), g.get(ax::str("ids.", k)));
    expected.emplace_back(ax::str("logits.", k), logits[row].narrow(0, off, len).contiguous());
    for (const char* key : {"pixel_values.", "grid."})  // gemma3's images have no grid
      if (g.find(ax::str(key, k))) expected.emplace_back(ax::str(key, k), g.get(ax::str(key, k)));
  }
  ax::safetensors::save((out / "expected.safetensors").string(), expected);
  std::ofstream(out / "base_dir.txt") << dir;
}

// Adapters we save reload with the same logits, name the language model's modules as peft does
// (`want_keys`: some of them) and exclude the vision side. With AXENGINE_VLM_PEFT_EXPORT_DIR set (and `export_dir`),
// the adapter, the samples and our logits are left there for tests/python/check_vlm_peft.py.
inline void check_adapter_round_trip(const std::string& dir, const Packed& p, const ax::safetensors::File& g,
                                     const std::vector<std::string>& want_keys, bool export_dir,
                                     std::vector<std::string> targets = {"q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"}) {
  namespace fs = std::filesystem;
  ax::LoraSpec spec;
  spec.targets = std::move(targets);
  spec.r = 3;
  spec.alpha = 7;
  spec.seed = 5;
  auto l = load(dir, "reference", "", spec);
  auto& vl = l.as<ax::models::VlModel>();
  for (const auto& m : vl.text().lora().modules) {  // B random, so the adapter changes the logits
    at::NoGradGuard ng;
    m.b.copy_(at::randn_like(m.b) * 0.3);
  }
  at::Tensor logits = l.model->forward(p.batch, true).logits.detach();
  const char* env = export_dir ? std::getenv("AXENGINE_VLM_PEFT_EXPORT_DIR") : nullptr;
  fs::path out = env ? fs::path(env) : ax::test::scratch_dir(vl.description().family + "_adapter");
  l.model->save_adapter((out / "adapter").string());
  auto cfg = ax::models::read_json_file((out / "adapter" / "adapter_config.json").string());
  CHECK(cfg["exclude_modules"] == vl.description().exclude);
  auto st = ax::safetensors::File::open((out / "adapter" / "adapter_model.safetensors").string());
  for (const auto& k : want_keys) {
    CAPTURE(k);
    CHECK(st->find(k) != nullptr);
  }
  auto again = load(dir, "reference", (out / "adapter").string());
  // The round trip itself is exact: the same sites, factors bit for bit, the same scaling. The logits then agree to
  // fp32 rounding, not bitwise: MKL's sgemm without its reproducibility mode (MKL_CBWR) may take other code paths
  // for operands at other addresses, and a reloaded model's tensors sit elsewhere (CI measured 6.1e-6 on gemma3).
  const auto& before = vl.text().lora().modules;
  const auto& after = again.as<ax::models::VlModel>().text().lora().modules;
  REQUIRE(before.size() == after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CAPTURE(before[i].site.path);
    CHECK(after[i].site.path == before[i].site.path);
    CHECK(at::equal(after[i].a, before[i].a));
    CHECK(at::equal(after[i].b, before[i].b));
    CHECK(after[i].scaling == before[i].scaling);
  }
  CHECK(rel_max(again.model->forward(p.batch, true).logits, logits) <= 5e-5);
  if (!env) {
    ax::test::remove_tree(out);
    return;
  }
  export_for_peft(out, dir, p, g, logits);
}

// 30 plain SGD steps of a new rank-4 LoRA on `targets` (default: every projection) lower the loss of the packed batch.
inline void check_training_lowers_loss(const std::string& dir, const Packed& p,
                                       std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                           "up_proj", "down_proj"}) {
  ax::LoraSpec spec;
  spec.targets = std::move(targets);
  spec.r = 4;
  auto l = load(dir, "reference", "", spec);
  std::vector<at::Tensor> params;
  for (const auto& [n, t] : l.model->trainable_parameters()) params.push_back(t);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto out = l.model->forward(p.batch, false);
    for (auto& t : params) t.mutable_grad() = at::Tensor();
    out.loss.backward();
    at::NoGradGuard ng;
    for (auto& t : params) t.sub_(t.grad() * 0.05);
    (step == 0 ? first : last) = out.loss.item<double>();
  }
  CAPTURE(first);
  CAPTURE(last);
  CHECK(last < first - 0.3);
}

// merge-lora (models/composite.hpp) against transformers + peft's merge_and_unload (scripts/goldens/
// make_vlm_merge_goldens.py: merged_golden.safetensors): the merged dir holds the tensors save_pretrained writes,
// the vision side byte for byte, and its logits are the adapter model's (ours) and the peer's merged model's, fp32.
inline void check_merge(const std::string& dir, const Packed& p) {
  namespace fs = std::filesystem;
  auto merged_golden = ax::safetensors::File::open(dir + "/merged_golden.safetensors");
  auto ours = load(dir, "reference", dir + "/adapter");
  const ax::models::VlDescription& d = ours.as<ax::models::VlModel>().description();
  fs::path out = ax::test::scratch_dir(d.family + "_merged");
  fs::remove_all(out);
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::merge_lora_dir(registry, dir, dir + "/adapter", out.string(), "", std::nullopt);

  auto written = ax::safetensors::Checkpoint::open_dir(out.string());
  CHECK(ax::join(written.names(), ",") == merged_golden->metadata().at("names"));
  auto base = ax::safetensors::Checkpoint::open_dir(dir);
  int vision = 0;
  for (const auto& n : base.names())
    if (d.vision_name(n)) {
      CAPTURE(n);
      const at::Tensor a = base.get(n), b = written.get(n);
      REQUIRE((a.scalar_type() == b.scalar_type()));
      CHECK(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
      ++vision;
    }
  CHECK(vision > 10);
  CHECK(ax::models::read_json_file((out / "config.json").string())["model_type"] == d.family);

  const at::Tensor adapter_logits = ours.model->forward(p.batch, true).logits;
  const at::Tensor merged = load(out.string(), "reference", "").model->forward(p.batch, true).logits;
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    auto [row, off, len] = p.where[k];
    CHECK(rel_max(merged[row].narrow(0, off, len), merged_golden->get(ax::str("logits.", k))) <= 1e-5);
    CHECK(rel_max(merged[row].narrow(0, off, len), adapter_logits[row].narrow(0, off, len)) <= 1e-5);
  }
  ax::test::remove_tree(out);
}

}  // namespace ax::test::vl
