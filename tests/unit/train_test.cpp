// The trainer on a tiny real model: loss falls, a resumed run repeats the uninterrupted one bit for bit
// (also across epoch boundaries), a non-finite loss stops the run and leaves the last checkpoint loadable,
// AdamW matches its formula, schedules have the right shape, old checkpoints are pruned, cpu_threads is clamped.
#include <doctest/doctest.h>

#include <sched.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/registry.hpp"
#include "data/register.hpp"
#include "train/checkpoint.hpp"
#include "train/optimizers.hpp"
#include "train/schedule.hpp"
#include "train/trainer.hpp"
#include "unit/test_paths.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;

using ax::test::Harness;
using ax::test::make_run_dir;

TEST_CASE("trainer: loss falls, and resuming from any checkpoint repeats the run bitwise, across epochs") {
  auto dir = make_run_dir("train_resume", "");
  Harness full(dir);
  auto a = full.run();
  REQUIRE(a.losses.size() == 12);
  CHECK(a.losses.back() < 0.8 * a.losses.front());
  auto ck = dir / "out" / "checkpoints";
  CHECK(fs::is_directory(ck / "step-00000004"));
  CHECK(fs::is_directory(ck / "step-00000008"));
  CHECK(fs::is_directory(ck / "step-00000012"));
  CHECK(fs::is_regular_file(ck / "step-00000012" / "adapter_model.safetensors"));
  CHECK(fs::is_regular_file(dir / "out" / "report.html"));
  CHECK(fs::is_regular_file(dir / "out" / "metrics.jsonl"));

  // 6 steps per epoch: from step 4 the resumed run crosses into epoch 1 at step 6, from 8 it ends epoch 1.
  for (int from : {4, 8}) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", from);
    Harness resumed(dir, {"run.output_dir=out_resumed_" + std::to_string(from),
                          "checkpoint.resume_from=" + (ck / name).string()});
    auto b = resumed.run();
    REQUIRE(b.losses.size() == static_cast<std::size_t>(12 - from));
    for (std::size_t i = 0; i < b.losses.size(); ++i) CHECK(b.losses[i] == a.losses[from + i]);  // bitwise
    for (const auto& [n, p] : full.model.trainable_parameters()) CHECK(at::equal(p, resumed.model.w(n)));
  }
  // resume_from = "latest" in a finished run's directory: nothing left to do, same final parameters.
  Harness latest(dir, {"checkpoint.resume_from=latest"});
  auto c = latest.run();
  CHECK(c.first_step == 12);
  ax::test::remove_tree(dir);
}

TEST_CASE("trainer: a non-finite loss stops the run and leaves the last good checkpoint loadable") {
  auto dir = make_run_dir("train_nan", "");
  Harness h(dir);
  h.model.nan_after_calls = 5;  // step 6 (one forward per step)
  std::string err;
  try {
    h.run();
  } catch (const ax::RuntimeError& e) {
    err = e.what();
  }
  CHECK(err.find("non-finite loss") != std::string::npos);
  CHECK(err.find("step-00000004") != std::string::npos);
  auto latest = ax::train::find_latest_checkpoint((dir / "out").string());
  CHECK(latest.find("step-00000004") != std::string::npos);
  auto ck = ax::train::load_checkpoint(latest);
  CHECK(ck.state.step == 4);
  ax::test::remove_tree(dir);
}

TEST_CASE("AdamW (reference path) follows the decoupled-weight-decay formula") {
  ax::Registry reg;
  ax::train::register_builtin_optimizers(reg);
  auto provider = reg.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "adamw");
  REQUIRE(provider);
  at::Tensor p = at::tensor({1.0, -2.0, 0.5}, at::kDouble).set_requires_grad(true);
  ax::ParamGroup g;
  g.params = {p};
  g.weight_decay = 0.1;
  toml::table opts{{"beta1", 0.8}, {"beta2", 0.9}, {"eps", 1e-6}};
  auto opt = provider->create({g}, opts);
  std::vector<double> x{1.0, -2.0, 0.5}, m(3, 0), v(3, 0);
  const double lr = 0.05;
  for (int t = 1; t <= 3; ++t) {
    std::vector<double> grad{0.3 * t, -0.1, 2.0 / t};
    p.mutable_grad() = at::tensor(grad, at::kDouble);
    opt->step(lr);
    for (int i = 0; i < 3; ++i) {
      x[i] *= 1 - lr * 0.1;
      m[i] = 0.8 * m[i] + 0.2 * grad[i];
      v[i] = 0.9 * v[i] + 0.1 * grad[i] * grad[i];
      double mh = m[i] / (1 - std::pow(0.8, t)), vh = std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.9, t));
      x[i] -= lr * mh / (vh + 1e-6);
    }
    for (int i = 0; i < 3; ++i) CHECK(p[i].item<double>() == doctest::Approx(x[i]).epsilon(1e-12));
  }
  auto state = opt->state_dict();
  CHECK(state.at("step").item<int64_t>() == 3);
  state.erase("g0.p0.exp_avg");
  CHECK_THROWS_WITH_AS(opt->load_state_dict(state), doctest::Contains("'g0.p0.exp_avg' is missing"), ax::UsageError);
  toml::table bad{{"beta3", 0.5}};
  CHECK_THROWS_WITH_AS(provider->create({g}, bad), doctest::Contains("unknown key 'optimizer.beta3'"), ax::ConfigError);
}

TEST_CASE("schedules: warmup then constant / linear / cosine down to min_lr_ratio") {
  ax::train::Schedule s{"cosine", 1.0, 4, 14, 0.1};
  CHECK(s.at(0) == doctest::Approx(0.25));
  CHECK(s.at(3) == doctest::Approx(1.0));
  CHECK(s.at(4) == doctest::Approx(1.0));
  CHECK(s.at(13) == doctest::Approx(0.1));
  CHECK(s.at(9) < s.at(5));
  s.kind = "linear";
  CHECK(s.at(13) == doctest::Approx(0.1));
  CHECK(s.at(8) == doctest::Approx(0.1 + 0.9 * (1 - 4.0 / 9.0)));
  s.kind = "constant";
  CHECK(s.at(13) == doctest::Approx(1.0));
}

TEST_CASE("checkpoints: keep_last prunes old ones and a half-written one is never picked up") {
  auto dir = ax::test::scratch_dir("train_ckpt");
  ax::train::CheckpointPayload pl;
  pl.params = {{"w", at::ones({2, 2})}};
  pl.state.steps_per_epoch = 10;
  pl.state.total_steps = 10;
  for (int step : {1, 2, 3}) {
    pl.state.step = pl.state.step_in_epoch = step;
    ax::train::save_checkpoint(dir.string(), step, pl, 2);
  }
  auto ck = dir / "checkpoints";
  CHECK_FALSE(fs::exists(ck / "step-00000001"));
  CHECK(fs::exists(ck / "step-00000002"));
  fs::create_directories(ck / ".tmp-step-00000004");  // a save killed half-way
  CHECK(ax::train::find_latest_checkpoint(dir.string()) == (ck / "step-00000003").string());
  auto loaded = ax::train::load_checkpoint((ck / "step-00000003").string());
  CHECK(at::equal(loaded.params.at("w"), at::ones({2, 2})));
  ax::test::remove_tree(dir);
}

TEST_CASE("trainer: train.cpu_threads above the usable cores is clamped to them") {
  // 4096 intra-op threads on a 2-core machine made one step take over 60 s: the run uses the cores it has.
  auto dir = make_run_dir("train_threads", "");
  const int before = at::get_num_threads();
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const int cores = CPU_COUNT(&set);
  Harness h(dir, {"train.cpu_threads=4096", "train.max_steps=1", "eval.every_steps=0", "checkpoint.every_steps=0"});
  auto s = h.run();
  const int used = at::get_num_threads();
  at::set_num_threads(before);
  CHECK(s.steps == 1);
  CHECK(used == cores);
  ax::test::remove_tree(dir);
}
