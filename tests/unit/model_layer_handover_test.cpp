// DecoderModel's load hands each layer to a LayerResidency as soon as it holds all of it (shard_base while
// loading, models/layer_residency.hpp), for every way a layer's tensors are read: dense, quantised at load
// (nf4 double quant, mxfp4, nvfp4; experts included), pre-quantised bitsandbytes nf4, gpt-oss mxfp4 blocks,
// per-expert checkpoint keys stacked at load, tied embeddings. An owner that copies the layers and puts them
// back while a layer runs gives the logits of the model loaded whole, bit for bit, and the load leaves no
// layer tensor in the model. No process group: the owner is in-process.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/builtins.hpp"
#include "axengine/engine.hpp"
#include "axengine/models.hpp"
#include "axengine/selection.hpp"
#include "models/decoder.hpp"
#include "models/register.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

// Keeps a copy of each layer (as shard_base keeps a copy of its chunk) and fills the slots while it runs.
class CopyLayers final : public ax::models::LayerResidency {
 public:
  void take_layer(int64_t layer, const std::vector<at::Tensor*>& slots) override {
    CHECK(layer == static_cast<int64_t>(layers_.size()));  // once each, in order
    CHECK(!slots.empty());
    std::vector<std::pair<at::Tensor*, at::Tensor>> kept;
    std::map<const void*, at::Tensor> copies;  // a storage several slots share (the double-quant code): one copy
    for (at::Tensor* t : slots) {
      REQUIRE(t->defined());
      auto [it, fresh] = copies.try_emplace(t->data_ptr(), at::Tensor());
      if (fresh) {
        it->second = t->clone();
        bytes_ += static_cast<int64_t>(it->second.storage().nbytes());
      }
      kept.emplace_back(t, it->second.view(t->sizes()));
    }
    for (at::Tensor* t : slots) *t = at::Tensor();
    layers_.push_back(std::move(kept));
  }
  void acquire(int64_t layer) override {
    ++acquired_;
    for (auto& [slot, t] : layers_.at(static_cast<std::size_t>(layer))) *slot = t;
  }
  void release(int64_t layer) noexcept override {
    for (auto& [slot, t] : layers_.at(static_cast<std::size_t>(layer))) *slot = at::Tensor();
  }
  int64_t resident_bytes() const override { return bytes_; }
  std::size_t layers() const { return layers_.size(); }
  int64_t acquired() const { return acquired_; }

 private:
  std::vector<std::vector<std::pair<at::Tensor*, at::Tensor>>> layers_;
  int64_t bytes_ = 0, acquired_ = 0;
};

struct Env {
  ax::Registry reg;
  Env() { ax::register_builtins(reg); }
  ax::ModelLoadOptions options(const fs::path& dir, const std::string& format, bool double_quant = false) const {
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    o.weights.format = format;
    o.weights.double_quant = double_quant;
    return o;
  }
};

at::Tensor logits_of(ax::Model& m, int64_t vocab) {
  at::NoGradGuard no_grad;
  ax::Batch b;
  b.input_ids = at::arange(0, 14, at::kLong).remainder(vocab).reshape({2, 7});
  return m.forward(b, true).logits;
}

// `dir` loaded whole and loaded handing its layers over: same logits, same stats, no layer left in the model.
void check_handover(Env& env, const fs::path& dir, const std::string& format, bool double_quant = false) {
  CAPTURE(dir.string());
  CAPTURE(format);
  const ax::ModelLoadOptions o = env.options(dir, format, double_quant);
  auto whole = ax::load_model(env.reg, o);
  auto owner = std::make_shared<CopyLayers>();
  auto handed = ax::models::load_model(env.reg, o, owner);
  REQUIRE(handed);
  auto& dm = dynamic_cast<ax::models::DecoderModel&>(*handed);
  const int64_t L = dm.config().num_layers;
  CHECK(owner->layers() == static_cast<std::size_t>(L));
  for (int64_t i = 0; i < L; ++i) CHECK(dm.layer_base_tensors(i).empty());  // every slot emptied by the load

  const ax::WeightStats w = whole->weight_stats(), h = handed->weight_stats();
  CHECK(h.format == w.format);
  CHECK(h.params == w.params);
  CHECK(h.packed_params == w.packed_params);
  if (format != "dense") CHECK(w.packed_params > 0);  // the quantised-at-load paths did pack
  CHECK(h.packed_bytes == w.packed_bytes);
  CHECK(dm.whole_base_bytes() == w.bytes);
  CHECK(h.bytes < w.bytes + owner->resident_bytes());  // the layers are counted as the owner's, once
  CHECK(h.bytes >= owner->resident_bytes());
  CHECK(h.peak_bytes >= h.bytes);

  const at::Tensor want = logits_of(*whole, dm.config().vocab_size), got = logits_of(*handed, dm.config().vocab_size);
  CHECK(owner->acquired() == L);
  CHECK(at::equal(got, want));
}

}  // namespace

TEST_CASE("layer hand-over while loading: dense, tied embeddings, per-expert keys, pre-quantised nf4, gpt-oss mxfp4") {
  Env env;
  const fs::path models = fs::path(AXENGINE_TEST_DATA_DIR) / "models";
  check_handover(env, models / "llama", "dense");    // tie_word_embeddings
  check_handover(env, models / "mixtral", "dense");  // per-expert keys stacked at load
  check_handover(env, models / "qwen3_moe", "dense");
  check_handover(env, fs::path(AXENGINE_TEST_DATA_DIR) / "bnb" / "qwen3_nf4_dq", "dense");  // packed as stored
  check_handover(env, models / "gpt_oss_mxfp4", "dense");  // mxfp4 blocks/scales as stored
}

TEST_CASE("layer hand-over while loading: projections and experts quantised at load (nf4 double quant, mxfp4, nvfp4)") {
  Env env;
  auto dir = ax::test::scratch_dir("layer_handover_quant");
  ax::init_model_dir("tiny-qwen3-moe", (dir / "model").string(), 5);
  check_handover(env, dir / "model", "nf4", true);
  check_handover(env, dir / "model", "mxfp4");
  check_handover(env, dir / "model", "nvfp4");
  ax::test::remove_tree(dir);
}

TEST_CASE("layer hand-over while loading: a family with layers of its own is not loaded") {
  Env env;
  auto owner = std::make_shared<CopyLayers>();
  const ax::ModelLoadOptions o = env.options(fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "qwen2_5_vl", "dense");
  CHECK(ax::models::load_model(env.reg, o, owner) == nullptr);
  CHECK(owner->layers() == 0);
}
