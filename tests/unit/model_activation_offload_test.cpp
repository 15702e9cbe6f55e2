// [train] activation_offload (models/offload.hpp): the checkpointed layer inputs kept in host memory give bitwise
// the losses and LoRA gradients of activation checkpointing alone, over a few optimizer steps. On the CPU the test
// seam CheckpointStore::kHostCopy runs the offload path (copy out, link, prefetch, copy back); the CUDA case runs
// the real one (pinned host buffers, a side stream, events) and passes saying so without a device.
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
#include "train/train_config.hpp"

namespace fs = std::filesystem;
using ax::autograd::CheckpointStore;

namespace {

fs::path case_dir(const std::string& name) { return fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name; }

struct Trace {
  std::vector<at::Tensor> losses;              // a step's loss
  std::vector<std::vector<at::Tensor>> grads;  // a step's LoRA gradients
};

// `steps` SGD steps of a fresh LoRA (B nonzero, dropout on the dense model: the recomputation replays the RNG) with
// activation checkpointing, each layer input kept as `store` says.
Trace train_steps(const std::string& name, const std::string& device, CheckpointStore store, int steps) {
  ax::Registry reg;
  ax::register_builtins(reg);
  const bool moe = name == "mixtral";
  ax::LoraSpec spec;  // LoRA on experts takes no dropout (as peft)
  spec.targets = moe ? std::vector<std::string>{"q_proj", "v_proj", "gate_up_proj", "down_proj"}
                     : std::vector<std::string>{"q_proj", "v_proj", "gate_proj", "down_proj"};
  spec.dropout = moe ? 0.0 : 0.3;
  at::manual_seed(7);
  ax::ModelLoadOptions o;
  o.dir = case_dir(name).string();
  o.dtype = "fp32";
  o.device = device;
  o.lora = spec;
  o.activation_checkpointing = true;
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
  const ax::autograd::CheckpointStoreScope scope(store);
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

void check_equal(const Trace& a, const Trace& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(at::equal(a.losses[s], b.losses[s]));
    REQUIRE(a.grads[s].size() == b.grads[s].size());
    for (std::size_t i = 0; i < a.grads[s].size(); ++i) CHECK(at::equal(a.grads[s][i], b.grads[s][i]));
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
    const Trace plain = train_steps(name, "cpu", CheckpointStore::kDevice, steps);
    const auto before = ax::autograd::offload_counts();
    const Trace offloaded = train_steps(name, "cpu", CheckpointStore::kHostCopy, steps);
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
  const Trace t = train_steps("qwen3", "cpu", CheckpointStore::kHost, 1);
  CHECK(ax::autograd::offload_counts().stashed == before.stashed);
  CHECK(!ax::autograd::offloads(CheckpointStore::kHost, at::zeros({1})));
  CHECK(ax::autograd::offloads(CheckpointStore::kHostCopy, at::zeros({1})));
}

TEST_CASE("activation offload: pinned host memory and a side stream give bitwise the losses and LoRA grads (CUDA)") {
  if (!at::hasCUDA()) {
    MESSAGE("no CUDA device: nothing to compare on this machine");
    return;
  }
  for (const char* name : {"qwen3", "mixtral"}) {
    CAPTURE(name);
    const int steps = 3;
    const Trace plain = train_steps(name, "cuda:0", CheckpointStore::kDevice, steps);
    const auto before = ax::autograd::offload_counts();
    const Trace offloaded = train_steps(name, "cuda:0", CheckpointStore::kHost, steps);
    const auto after = ax::autograd::offload_counts();
    check_equal(plain, offloaded);
    const int64_t layers = layers_of(name);
    CHECK(after.stashed - before.stashed == steps * layers);
    CHECK(after.prefetched - before.prefetched == steps * (layers - 1));
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
