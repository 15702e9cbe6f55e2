// The long-context memory features (docs/training.md, "Long context").
// [train] activation_offload (models/offload.hpp): the checkpointed layer inputs kept in host memory give bitwise
// the losses and LoRA gradients of activation checkpointing alone, over a few optimizer steps. On the CPU the test
// seam CheckpointStore::kHostCopy runs the offload path (copy out, link, prefetch, copy back); the CUDA case runs
// the real one (pinned host buffers, a side stream, events) and passes saying so without a device.
// [train] tiled_mlp (models/tiled_mlp.hpp): the MLP / MoE block in token shards gives the untiled losses and LoRA
// gradients to fp32 rounding (1e-6 of the largest magnitude), with and without activation checkpointing.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "axengine/builtins.hpp"
#include "axengine/config.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/offload.hpp"
#include "models/tiled_mlp.hpp"
#include "train/memory_estimate.hpp"
#include "train/train_config.hpp"
#include "unit/test_util.hpp"
#include "unit/tiny_model.hpp"
#include "unit/validate_run_dir.hpp"

namespace fs = std::filesystem;
using ax::autograd::CheckpointStore;

namespace {

fs::path case_dir(const std::string& name) { return fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name; }

struct Trace {
  std::vector<at::Tensor> losses;              // a step's loss
  std::vector<std::vector<at::Tensor>> grads;  // a step's LoRA gradients
};

struct Setup {
  CheckpointStore store = CheckpointStore::kDevice;
  int64_t tiles = 1;
  bool checkpointing = true;
  double dense_dropout = 0.3;
  std::string format = "dense";  // model.weight_format: the projections packed at load (QLoRA)
};

Setup stored(CheckpointStore store) {
  Setup s;
  s.store = store;
  return s;
}

// `steps` SGD steps of a fresh LoRA (B nonzero, dropout on the dense model: the recomputation replays the RNG) as
// `setup` says.
Trace train_steps(const std::string& name, const std::string& device, const Setup& setup, int steps) {
  ax::Registry reg;
  ax::register_builtins(reg);
  const bool moe = name != "qwen3";
  ax::LoraSpec spec;  // LoRA on experts takes no dropout (as peft)
  spec.targets = moe ? std::vector<std::string>{"q_proj", "v_proj", "gate_up_proj", "down_proj"}
                     : std::vector<std::string>{"q_proj", "v_proj", "gate_proj", "down_proj"};
  spec.dropout = moe ? 0.0 : setup.dense_dropout;
  at::manual_seed(7);
  ax::ModelLoadOptions o;
  o.dir = case_dir(name).string();
  o.dtype = "fp32";
  o.device = device;
  o.lora = spec;
  o.activation_checkpointing = setup.checkpointing;
  o.weights.format = setup.format;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{},
                                              device == "cpu" ? ax::DeviceInfo{} : ax::detect_device("cuda"));
  auto m = ax::load_model(reg, o);
  auto params = m->trainable_parameters();
  {
    at::NoGradGuard ng;
    for (auto& [n, t] : params)
      if (n.find("lora_B") != std::string::npos) t.normal_(0, 0.1);
  }
  auto g = ax::safetensors::File::open((case_dir(name) / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  b.labels = b.input_ids;
  m->set_training(true);
  const ax::autograd::CheckpointStoreScope scope(setup.store);
  const ax::models::MlpTilesScope tiles(setup.tiles);
  Trace tr;
  for (int s = 0; s < steps; ++s) {
    for (auto& [n, t] : params) t.mutable_grad() = at::Tensor();
    auto out = m->forward(b, false);
    out.loss.backward();
    tr.losses.push_back(out.loss.detach().cpu());
    std::vector<at::Tensor> gs;
    at::NoGradGuard ng;
    for (auto& [n, t] : params) {
      REQUIRE_MESSAGE(t.grad().defined(), n);
      gs.push_back(t.grad().cpu().clone());
      t.sub_(t.grad(), 0.5);
    }
    tr.grads.push_back(std::move(gs));
  }
  return tr;
}

// Equal to `tol` of the largest magnitude (0: bitwise).
void check_equal(const Trace& a, const Trace& b, double tol = 0) {
  auto same = [tol](const at::Tensor& x, const at::Tensor& y) {
    if (tol == 0) return at::equal(x, y);
    const double scale = std::max(1.0, x.abs().max().item<double>());
    return (x - y).abs().max().item<double>() <= tol * scale;
  };
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(same(a.losses[s], b.losses[s]));
    REQUIRE(a.grads[s].size() == b.grads[s].size());
    for (std::size_t i = 0; i < a.grads[s].size(); ++i) CHECK(same(a.grads[s][i], b.grads[s][i]));
  }
  // The steps differ (the parameters moved): a run that ignored the update would compare equal too.
  CHECK(!at::equal(a.losses.front(), a.losses.back()));
}

int64_t layers_of(const std::string& name) {
  std::ifstream f(case_dir(name) / "config.json");
  return nlohmann::json::parse(f).at("num_hidden_layers").get<int64_t>();
}

}  // namespace

TEST_CASE("activation offload: layer inputs in a host copy give bitwise the losses and LoRA grads of checkpointing (CPU)") {
  for (const char* name : {"qwen3", "mixtral"}) {
    CAPTURE(name);
    const int steps = 3;
    const Trace plain = train_steps(name, "cpu", stored(CheckpointStore::kDevice), steps);
    const auto before = ax::autograd::offload_counts();
    const Trace offloaded = train_steps(name, "cpu", stored(CheckpointStore::kHostCopy), steps);
    const auto after = ax::autograd::offload_counts();
    check_equal(plain, offloaded);
    // Every layer's input went out and came back each step, all but the top layer's ahead of its backward.
    const int64_t layers = layers_of(name);
    CHECK(after.stashed - before.stashed == steps * layers);
    CHECK(after.taken - before.taken == steps * layers);
    CHECK(after.prefetched - before.prefetched == steps * (layers - 1));
  }
}

TEST_CASE("activation offload: kHost leaves CPU tensors where they are") {
  const auto before = ax::autograd::offload_counts();
  const Trace t = train_steps("qwen3", "cpu", stored(CheckpointStore::kHost), 1);
  CHECK(ax::autograd::offload_counts().stashed == before.stashed);
  CHECK(!ax::autograd::offloads(CheckpointStore::kHost, at::zeros({1})));
  CHECK(ax::autograd::offloads(CheckpointStore::kHostCopy, at::zeros({1})));
}

TEST_CASE("activation offload: pinned host memory and a side stream give bitwise the losses and LoRA grads; tiled MLP to 1e-6 (CUDA)") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: nothing to compare on this machine");
    return;
  }
  for (const char* name : {"qwen3", "mixtral"}) {
    CAPTURE(name);
    const int steps = 3;
    const Trace plain = train_steps(name, "cuda:0", stored(CheckpointStore::kDevice), steps);
    const auto before = ax::autograd::offload_counts();
    const Trace offloaded = train_steps(name, "cuda:0", stored(CheckpointStore::kHost), steps);
    const auto after = ax::autograd::offload_counts();
    check_equal(plain, offloaded);
    const int64_t layers = layers_of(name);
    CHECK(after.stashed - before.stashed == steps * layers);
    CHECK(after.prefetched - before.prefetched == steps * (layers - 1));
    // Tiled on the GPU: the untiled losses and grads to 1e-6 (dropout off), and offload changes nothing there either.
    Setup s;
    s.dense_dropout = 0;
    const Trace untiled = train_steps(name, "cuda:0", s, steps);
    s.tiles = 3;
    const Trace tiled = train_steps(name, "cuda:0", s, steps);
    check_equal(untiled, tiled, 1e-6);
    s.store = CheckpointStore::kHost;
    check_equal(tiled, train_steps(name, "cuda:0", s, steps));
  }
}

namespace {

// [train] of a run config holding `body`, as the run reads it.
ax::train::TrainConfig train_section(const std::string& body) {
  const fs::path dir = fs::temp_directory_path() / ("ax_offload_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "run.toml";
  std::ofstream(file) << "[train]\n" << body << "\n";
  auto cfg = ax::read_config(file.string());
  fs::remove_all(dir);
  return ax::train::read_train_config(cfg);
}

}  // namespace

TEST_CASE("activation offload: the key implies activation checkpointing, and is refused with it turned off") {
  CHECK(!train_section("").activation_offload);
  const auto implied = train_section("activation_offload = true");
  CHECK(implied.activation_offload);
  CHECK(implied.activation_checkpointing);
  CHECK(train_section("activation_offload = true\nactivation_checkpointing = true").activation_checkpointing);
  std::string err;
  try {
    train_section("activation_checkpointing = false\nactivation_offload = true");
  } catch (const std::exception& e) {
    err = e.what();
  }
  CHECK(err.find("train.activation_offload") != std::string::npos);
  CHECK(err.find("train.activation_checkpointing = true") != std::string::npos);
  CHECK(err.find("run.toml") != std::string::npos);
}

TEST_CASE("tiled MLP: the block in token shards gives the untiled losses and LoRA grads to 1e-6 (CPU)") {
  // qwen3: dense MLP; mixtral: MoE with the router aux loss (its logits concatenated over the shards); glm4_moe: a
  // dense first layer, then group-limited sigmoid routing with a shared expert. Dropout off: shards draw their masks
  // in another order than the whole block.
  for (const char* name : {"qwen3", "mixtral", "glm4_moe"}) {
    for (bool ckpt : {false, true}) {
      CAPTURE(name);
      CAPTURE(ckpt);
      Setup s;
      s.checkpointing = ckpt;
      s.dense_dropout = 0;
      const Trace untiled = train_steps(name, "cpu", s, 3);
      for (int64_t tiles : {2, 3, 1000}) {  // 1000: more shards than tokens, one token each
        CAPTURE(tiles);
        s.tiles = tiles;
        const int64_t calls = ax::models::tiled_mlp_shard_calls();
        check_equal(untiled, train_steps(name, "cpu", s, 3), 1e-6);
        CHECK(ax::models::tiled_mlp_shard_calls() - calls >= 3 * layers_of(name) * 2);  // the hook ran, in shards
      }
      s.tiles = 1;
    }
  }
  // Together with offload (the shards' inputs stay out of the offload chain: every layer input is still prefetched).
  Setup s;
  s.tiles = 2;
  s.dense_dropout = 0;
  const Trace tiled = train_steps("qwen3", "cpu", s, 2);
  s.store = CheckpointStore::kHostCopy;
  const auto before = ax::autograd::offload_counts();
  check_equal(tiled, train_steps("qwen3", "cpu", s, 2));
  const auto after = ax::autograd::offload_counts();
  CHECK(after.stashed - before.stashed == 2 * layers_of("qwen3"));
  CHECK(after.prefetched - before.prefetched == 2 * (layers_of("qwen3") - 1));
}

TEST_CASE("tiled MLP: shards in order, each recomputed in backward; router logits concatenated") {
  const ax::models::MlpTilesScope tiles(3);
  std::vector<int64_t> rows;  // the rows of each block call
  const ax::models::MlpBlock block = [&rows](const at::Tensor& t, std::vector<at::Tensor>& rl) {
    rows.push_back(t.size(0));
    rl.push_back(t.sum(-1, true));  // per-token "router logits"
    return t * t;
  };
  const at::Tensor x = at::arange(7 * 2, at::kDouble).reshape({7, 2}).requires_grad_(true);
  std::vector<at::Tensor> logits;
  const at::Tensor y = ax::models::tiled_mlp(block, x, logits);
  CHECK(rows == std::vector<int64_t>{3, 3, 1});
  CHECK(at::equal(y, x * x));
  REQUIRE(logits.size() == 1);
  CHECK(at::equal(logits[0], x.sum(-1, true)));
  (y.sum() + logits[0].sum()).backward();
  CHECK(rows == std::vector<int64_t>{3, 3, 1, 1, 3, 3});  // backward recomputes each shard, last first
  CHECK(at::equal(x.grad(), 2 * x.detach() + 1));
  rows.clear();
  {
    at::NoGradGuard ng;  // nothing to record: the shards just run
    std::vector<at::Tensor> l2;
    CHECK(at::equal(ax::models::tiled_mlp(block, x, l2), x * x));
  }
  CHECK(rows == std::vector<int64_t>{3, 3, 1});
}

TEST_CASE("long context cli: validate warns of activation_offload on the CPU and refuses what cannot apply") {
  using namespace ax_test;
  TempDir dir;
  make_run_dir(dir);
  auto validate = [&](const std::string& args) {
    // device.type = cpu: the warning is about the CPU, also where a GPU is present
    return ax_test::run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " --set device.type=cpu " + args);
  };
  const auto warned = validate("--set train.activation_offload=true");
  INFO(warned.output);
  CHECK(warned.exit_code == 0);
  CHECK(warned.output.find("train.activation_offload = true on the CPU: the layer inputs already live in host memory") !=
        std::string::npos);
  const auto contradicted = validate("--set train.activation_offload=true --set train.activation_checkpointing=false");
  INFO(contradicted.output);
  CHECK(contradicted.exit_code == 2);
  CHECK(contradicted.output.find("needs 'train.activation_checkpointing = true'") != std::string::npos);
  CHECK(validate("--set train.tiled_mlp=4").exit_code == 0);
  const auto zero = validate("--set train.tiled_mlp=0");
  CHECK(zero.exit_code == 2);
  CHECK(zero.output.find("tiled_mlp") != std::string::npos);
  const auto sharded = validate("--set train.tiled_mlp=2 --set distributed.shard_base=true");
  INFO(sharded.output);
  CHECK(sharded.exit_code == 2);
  CHECK(sharded.output.find("'train.tiled_mlp' = 2: not together with distributed.shard_base = true") != std::string::npos);
}

TEST_CASE("long context cli: a run with tiled_mlp and activation_offload trains the losses of a plain run") {
  using namespace ax_test;
  TempDir dir;
  make_run_dir(dir);
  auto losses = [&](const std::string& args, const std::string& out) {
    const auto r = ax_test::run(env(dir) + axengine() + " run --config " + (dir / "run.toml") + " --set run.output_dir=" + out + " " + args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<double> l;
    std::ifstream f(dir.path / out / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j.contains("step")) l.push_back(j["loss"].get<double>());
    }
    return l;
  };
  const auto plain = losses("", "plain");
  const auto tiled = losses("--set train.tiled_mlp=3 --set train.activation_offload=true", "tiled");
  REQUIRE(plain.size() == 2);
  REQUIRE(tiled.size() == plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(std::abs(tiled[i] - plain[i]) <= 1e-5 * std::abs(plain[i]));
}

TEST_CASE("long context: the activation estimate counts two layer inputs offloaded and the MLP over the tiles") {
  // The 8B shape at 128k tokens, bf16: offload keeps 2 of 36 layer inputs on the device; 4 tiles keep a quarter of
  // one layer's MLP intermediates.
  const nlohmann::json c = {{"hidden_size", 4096}, {"num_hidden_layers", 36}, {"vocab_size", 151936}, {"intermediate_size", 12288}};
  ax::train::ActivationShape s;
  s.sequence_len = 131072;
  s.dtype_bytes = 2;
  s.activation_checkpointing = true;
  const double ckpt = ax::train::estimate_activations(c, s)->bytes;
  s.activation_offload = true;
  const double offloaded = ax::train::estimate_activations(c, s)->bytes;
  CHECK(ckpt - offloaded == doctest::Approx(34.0 * 131072 * 4096 * 2));
  s.mlp_tiles = 4;
  CHECK(offloaded - ax::train::estimate_activations(c, s)->bytes == doctest::Approx(0.75 * 131072 * 3 * 12288 * 2));
}

TEST_CASE("tiled MLP auto: the fewest shards (a power of two) whose estimate fits half the memory, at least 1024 tokens a shard") {
  const nlohmann::json c = {{"hidden_size", 4096}, {"num_hidden_layers", 36}, {"vocab_size", 151936}, {"intermediate_size", 12288}};
  ax::train::ActivationShape s;
  s.sequence_len = 131072;
  s.dtype_bytes = 2;
  s.activation_checkpointing = true;
  auto bytes = [&](int64_t tiles) {
    ax::train::ActivationShape t = s;
    t.mlp_tiles = tiles;
    return ax::train::estimate_activations(c, t)->bytes;
  };
  using ax::train::choose_mlp_tiles;
  CHECK(choose_mlp_tiles(c, s, 2 * bytes(1)) == 1);           // fits untiled: no shards
  CHECK(choose_mlp_tiles(c, s, 2 * bytes(1) - 1) == 2);       // a byte short: the first count that fits
  CHECK(choose_mlp_tiles(c, s, 2 * bytes(4)) == 4);           // 2 does not fit, 4 does
  CHECK(choose_mlp_tiles(c, s, 2 * bytes(8) + 1e6) == 8);
  CHECK(choose_mlp_tiles(c, s, 1e9) == 131072 / 1024);        // nothing fits: shards of 1024 tokens
  // The 8B shape at 128k tokens with checkpointing (no offload): an 80 GiB device gets the cap, a 141 GiB one none.
  CHECK(choose_mlp_tiles(c, s, 80.0 * (1 << 30)) == 128);
  CHECK(choose_mlp_tiles(c, s, 141.0 * (1 << 30)) == 1);
  // Context parallelism: a rank's 1/N of the tokens, capped the same way.
  s.context_parallel = 4;
  CHECK(choose_mlp_tiles(c, s, 1e9) == 131072 / 4 / 1024);
  // Rows shorter than a shard: untiled whatever the memory.
  s.context_parallel = 1;
  s.sequence_len = 512;
  CHECK(choose_mlp_tiles(c, s, 1) == 1);
  CHECK(!choose_mlp_tiles(nlohmann::json::object(), s, 1e12).has_value());  // no sizes: no estimate
}

TEST_CASE("tiled MLP auto cli: validate says the count it chose; another string is refused by name") {
  using namespace ax_test;
  TempDir dir;
  make_run_dir(dir);
  auto validate = [&](const std::string& args) {
    return ax_test::run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " --set device.type=cpu " + args);
  };
  const auto chosen = validate("--set train.tiled_mlp=auto");
  INFO(chosen.output);
  CHECK(chosen.exit_code == 0);
  CHECK(chosen.output.find("train.tiled_mlp = \"auto\": 1 shard (untiled) (the estimate against 0.5 of ") != std::string::npos);
  const auto wrong = validate("--set train.tiled_mlp=many");
  INFO(wrong.output);
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.output.find("tiled_mlp") != std::string::npos);
  CHECK(wrong.output.find("auto") != std::string::npos);
  const auto sharded = validate("--set train.tiled_mlp=auto --set distributed.shard_base=true");
  INFO(sharded.output);
  CHECK(sharded.exit_code == 0);
  CHECK(sharded.output.find("1 shard (untiled) (tiling is not built with shard_base or expert_parallel)") != std::string::npos);
}

TEST_CASE("tiled MLP: packed experts are dequantised once per pass over the shards, not per shard (QLoRA, CPU)") {
  // mixtral's 2 MoE layers in nf4 (the other formats take the same path; at this model's widths mxfp4 and nvfp4 keep
  // some expert weights dense, which the cache passes by): each pass (a forward over the shards, a backward recomputing them)
  // decodes each layer's gate_up and down once, whatever the shard count; the results are the untiled run's to
  // fp32 rounding (the tiled MLP tests' bound), the decoded weights being the op's own (the compute dtype's).
  for (const char* format : {"nf4"}) {
    for (bool ckpt : {false, true}) {
      CAPTURE(format);
      CAPTURE(ckpt);
      Setup s;
      s.format = format;
      s.checkpointing = ckpt;
      s.dense_dropout = 0;
      const int64_t before_untiled = ax::models::expert_dequant_calls();
      const Trace untiled = train_steps("mixtral", "cpu", s, 3);
      CHECK(ax::models::expert_dequant_calls() == before_untiled);  // untiled: the op decodes, no cache
      for (int64_t tiles : {2, 4}) {
        CAPTURE(tiles);
        s.tiles = tiles;
        const int64_t before = ax::models::expert_dequant_calls();
        check_equal(untiled, train_steps("mixtral", "cpu", s, 3), 1e-6);
        // Per step and MoE layer, 2 weights x (forward, backward); with checkpointing the layer's first forward is
        // one pass more (its recomputation in backward runs the shards again, then their backward).
        CHECK(ax::models::expert_dequant_calls() - before == 3 * layers_of("mixtral") * 2 * (ckpt ? 3 : 2));
      }
    }
  }
}
