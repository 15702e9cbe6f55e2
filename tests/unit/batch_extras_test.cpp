// Batches carry more than tokens: a dataset type's per-sample extras (here per-token 3-axis positions and an
// image-grid-like tensor on some samples) survive the prepared-data cache, are collated by the type's own
// collate() hook and reach the model on every training batch; a text-only model ignores them. Batches also
// carry the host facts (cu_seqlens on the host, the token id range) a device forward validates with, and
// AdamW skips a step flagged by found_inf.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/dataset.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/selection.hpp"
#include "data/packing.hpp"
#include "data/prepare.hpp"
#include "train/optimizers.hpp"
#include "unit/test_paths.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;

namespace {

// Sample i: 4 + i % 9 tokens; extra "pos3" [n, 3] = (k, 2k, 100 + i) per token k; extra "grid" [1, 3] =
// (i, 1, 1) on even samples only. With bad = true, sample 3's pos3 is [n, 2].
class ExtrasDataset final : public ax::Dataset {
 public:
  ExtrasDataset(std::size_t rows, bool bad) : rows_(rows), bad_(bad) {}
  std::size_t size() const override { return rows_; }
  ax::Sample get(std::size_t i) const override {
    ax::Sample s;
    const int64_t n = 4 + static_cast<int64_t>(i % 9);
    for (int64_t k = 0; k < n; ++k) s.input_ids.push_back(static_cast<int32_t>(10 + (i * 7 + k * 3) % 200));
    s.labels = s.input_ids;
    at::Tensor k = at::arange(n, at::kLong);
    s.extras["pos3"] = at::stack({k, 2 * k, at::full({n}, 100 + static_cast<int64_t>(i), at::kLong)}, 1);
    if (bad_ && i == 3) s.extras["pos3"] = s.extras["pos3"].narrow(1, 0, 2).contiguous();
    if (i % 2 == 0) s.extras["grid"] = at::tensor({static_cast<int64_t>(i), int64_t{1}, int64_t{1}}, at::kLong).view({1, 3});
    return s;
  }

 private:
  std::size_t rows_;
  bool bad_;
};

class ExtrasType final : public ax::DatasetType {
 public:
  std::vector<std::string> known_keys() const override { return {"type", "name", "path", "rows", "bad"}; }
  std::shared_ptr<ax::Dataset> open(const toml::table& entry, const ax::DatasetContext&) const override {
    return std::make_shared<ExtrasDataset>(static_cast<std::size_t>(entry["rows"].value_or(int64_t{40})), entry["bad"].value_or(false));
  }
  // pos3 per token (the default collation); the grids of the batch's samples stacked, with their rows.
  std::map<std::string, at::Tensor> collate(const ax::BatchLayout& layout) const override {
    auto out = ax::collate_per_token_extras(layout, {"pos3"});
    std::vector<at::Tensor> grids;
    std::vector<int64_t> rows;
    for (const auto& p : layout.samples)
      if (auto it = p.sample->extras.find("grid"); it != p.sample->extras.end()) {
        grids.push_back(it->second);
        rows.push_back(p.row);
      }
    out["grid"] = grids.empty() ? at::zeros({0, 3}, at::kLong) : at::cat(grids, 0);
    out["grid_row"] = at::tensor(rows, at::kLong);
    return out;
  }
};

void add_extras_type(ax::Registry& reg) {
  ax::Provider p;
  p.info.kind = ax::ProviderKind::dataset;
  p.info.name = "test_extras";
  p.info.summary = "test: samples with per-token and per-sample extras";
  p.object = std::make_shared<ExtrasType>();
  reg.add(std::move(p));
}

fs::path extras_run_dir(const std::string& name, const std::string& data_extra) {
  auto dir = ax::test::scratch_dir(name);
  ax::test::write_text(dir / "run.toml", "[run]\noutput_dir = \"out\"\nseed = 3\n"
                                         "[data]\nsequence_len = 32\neval_fraction = 0.0\n" + data_extra +
                                         "[[datasets]]\ntype = \"test_extras\"\npath = \"unused.jsonl\"\nrows = 40\n"
                                         "[train]\nlr = 0.01\nmax_steps = 4\n"
                                         "[eval]\nevery_steps = 0\n[checkpoint]\nevery_steps = 0\n");
  return dir;
}

}  // namespace

TEST_CASE("batch extras: a dataset type collates its extras and they reach the model on every training batch") {
  auto dir = extras_run_dir("batch_extras", "cache = false\n");
  ax::test::Harness h(dir, {}, add_extras_type);
  REQUIRE(h.setup.data.collator);
  CHECK(h.setup.data.collator_type == "test_extras");
  h.model.record_batches = true;
  auto sum = h.run();
  REQUIRE(sum.steps == 4);
  REQUIRE(h.model.training_batches.size() == 4);
  for (const ax::Batch& b : h.model.training_batches) {
    REQUIRE(b.extras.count("pos3"));
    REQUIRE(b.extras.count("grid"));
    const at::Tensor& pos3 = b.extras.at("pos3");
    REQUIRE(pos3.sizes() == at::IntArrayRef({1, 32, 3}));
    at::Tensor marker = pos3.select(2, 2), real = marker.ne(0);
    // Real tokens carry their sample's positions; padding is zero and has no loss.
    CHECK(at::equal(pos3.select(2, 0).masked_select(real), b.position_ids.masked_select(real)));
    CHECK(at::equal(pos3.select(2, 1).masked_select(real), 2 * b.position_ids.masked_select(real)));
    CHECK(b.labels.masked_select(real.logical_not()).eq(-100).all().item<bool>());
    // The collate hook's own extra: one grid row per even sample of the batch, in placement order.
    std::vector<int64_t> even;
    at::Tensor m = marker.flatten();
    for (int64_t t = 0; t < m.size(0); ++t) {
      int64_t v = m[t].item<int64_t>();
      if (v != 0 && (t == 0 || m[t - 1].item<int64_t>() != v) && (v - 100) % 2 == 0) even.push_back(v - 100);
    }
    const at::Tensor& grid = b.extras.at("grid");
    REQUIRE(grid.size(0) == static_cast<int64_t>(even.size()));
    for (std::size_t g = 0; g < even.size(); ++g) CHECK(grid[static_cast<int64_t>(g)][0].item<int64_t>() == even[g]);
    CHECK(b.extras.at("grid_row").size(0) == static_cast<int64_t>(even.size()));
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("batch extras: the prepared-data cache keeps them and extras of inconsistent shape are refused") {
  auto dir = extras_run_dir("batch_extras_cache", "");
  ax::test::write_text(dir / "run.toml",
                       "[run]\noutput_dir = \"out\"\n[data]\nsequence_len = 32\neval_fraction = 0.0\ncache = true\ncache_dir = \"" +
                           (dir / "cache").string() + "\"\n[[datasets]]\ntype = \"test_extras\"\npath = \"unused.jsonl\"\nrows = 12\n");
  ax::Registry reg;
  add_extras_type(reg);
  ax::test::ByteTokenizer tok;
  auto cfg = ax::load_config((dir / "run.toml").string(), {});
  auto dc = ax::data::read_data_config(cfg);
  auto fresh = ax::data::prepare_datasets(cfg, dc, reg, tok);
  auto cached = ax::data::prepare_datasets(cfg, dc, reg, tok);
  REQUIRE(cached.sources.at(0).from_cache);
  REQUIRE(fresh.train.size() == 12);
  REQUIRE(cached.train.size() == 12);
  for (std::size_t i = 0; i < fresh.train.size(); ++i) {
    CAPTURE(i);
    const auto& a = fresh.train[i].extras;
    const auto& b = cached.train[i].extras;
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : a) {
      REQUIRE(b.count(name));
      CHECK(at::equal(t, b.at(name)));
    }
  }
  CHECK(cached.collator);

  ax::test::write_text(dir / "bad.toml", "[run]\noutput_dir = \"out\"\n[data]\nsequence_len = 32\neval_fraction = 0.0\ncache = false\n"
                                         "[[datasets]]\ntype = \"test_extras\"\npath = \"unused.jsonl\"\nrows = 12\nbad = true\n");
  auto bad = ax::load_config((dir / "bad.toml").string(), {});
  std::string err;
  try {
    ax::data::prepare_datasets(bad, ax::data::read_data_config(bad), reg, tok);
  } catch (const ax::UsageError& e) {
    err = e.what();
  }
  CHECK(err.find("sample 3 extra 'pos3'") != std::string::npos);
  CHECK(err.find("only dim 0 may vary") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("batch: make_batch and Batch::to record the host facts a device forward validates with") {
  std::vector<ax::Sample> s{{{5, 6, 7}, {5, 6, 7}, {}}, {{9, 3}, {9, 3}, {}}};
  auto packed = ax::data::pack_samples(s, {0, 1}, 8);
  auto b = ax::data::make_batch(s, packed, {0}, 8, 1);
  REQUIRE(b.cu_seqlens_host.defined());
  CHECK(at::equal(b.cu_seqlens_host, b.cu_seqlens));
  CHECK(b.min_token_id == 1);  // the padding id
  CHECK(b.max_token_id == 9);
  ax::Batch raw;
  raw.input_ids = at::tensor({4, 8, 2}, at::kLong).view({1, 3});
  raw.cu_seqlens = at::tensor({0, 3}, at::kInt);
  raw.extras["x"] = at::ones({1, 3});
  ax::Batch moved = raw.to(at::Device(at::kCPU));
  CHECK(moved.min_token_id == 2);
  CHECK(moved.max_token_id == 8);
  REQUIRE(moved.cu_seqlens_host.defined());
  CHECK(moved.extras.count("x"));
  // input_ids and the integer extras (grids, indices) keep a host copy; floating extras are not kept twice.
  raw.extras["grid"] = at::tensor({1, 4, 6}, at::kLong).view({1, 3});
  moved = raw.to(at::Device(at::kCPU));
  REQUIRE(moved.input_ids_host.defined());
  CHECK(at::equal(moved.input_ids_host, raw.input_ids));
  REQUIRE(moved.extras_host.count("grid"));
  CHECK(at::equal(moved.extras_host.at("grid"), raw.extras.at("grid")));
  CHECK_FALSE(moved.extras_host.count("x"));
  // Samples with extras but nobody to collate them: a clear error, not a silent drop.
  s[0].extras["x"] = at::ones({3});
  CHECK_THROWS_WITH_AS(ax::data::make_batch(s, packed, {0}, 8, 1), doctest::Contains("no dataset type was given to collate"), ax::UsageError);
}

TEST_CASE("batch extras: a text-only model ignores them and its loss is bitwise the same") {
  ax::Registry reg;
  ax::register_builtins(reg);
  ax::ModelLoadOptions o;
  o.dir = (fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "qwen3").string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  auto m = ax::load_model(reg, o);
  std::vector<ax::Sample> s;
  for (int n : {5, 9, 4}) {
    ax::Sample x;
    for (int k = 0; k < n; ++k) x.input_ids.push_back(2 + (n * 5 + k * 3) % 50);
    x.labels = x.input_ids;
    x.extras["pos3"] = at::arange(3 * n, at::kLong).view({n, 3});
    s.push_back(x);
  }
  auto packed = ax::data::pack_samples(s, {0, 1, 2}, 20);
  ExtrasType type;
  ax::Batch with = ax::data::make_batch(s, packed, {0}, 20, 0, &type);
  REQUIRE(with.extras.count("pos3"));
  ax::Batch without = with;
  without.extras.clear();
  at::NoGradGuard ng;
  CHECK(at::equal(m->forward(with, false).loss, m->forward(without, false).loss));
}

TEST_CASE("AdamW: a step flagged by found_inf leaves parameters and state as they were") {
  ax::Registry reg;
  ax::train::register_builtin_optimizers(reg);
  auto provider = reg.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "adamw");
  REQUIRE(provider);
  at::Tensor p = at::tensor({1.0, -2.0, 3.0}, at::kFloat).set_requires_grad(true);
  at::Tensor q = p.detach().clone().set_requires_grad(true);
  ax::ParamGroup gp, gq;
  gp.params = {p};
  gp.weight_decay = 0.1;
  gq.params = {q};
  gq.weight_decay = 0.1;
  auto op = provider->create({gp}, toml::table{});
  auto oq = provider->create({gq}, toml::table{});
  auto grads = [&] {
    p.mutable_grad() = at::tensor({0.5, 0.25, -1.0}, at::kFloat);
    q.mutable_grad() = p.grad().clone();
  };
  grads();
  op->step(0.1, at::ones({}, at::kFloat));  // skipped
  CHECK(at::equal(p, q));
  CHECK(op->state_dict().at("step").item<int64_t>() == 0);
  op->step(0.1, at::zeros({}, at::kFloat));  // taken: the same as a plain step
  oq->step(0.1);
  CHECK(at::equal(p, q));
  CHECK_FALSE(at::equal(p, at::tensor({1.0, -2.0, 3.0}, at::kFloat)));
  for (const auto& [k, t] : op->state_dict()) CHECK(at::equal(t, oq->state_dict().at(k)));
}
