// fp16 training with dynamic loss scaling (train/loss_scaler.hpp), as torch.amp.GradScaler does it: the scaler's
// rule, a skipped step (inf gradients: no update, the AdamW count unchanged, the scale halved), tiny gradients that
// underflow in fp16 without it, checkpoints that carry its state bitwise across a resume, and the refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/optimizer.hpp"
#include "train/checkpoint.hpp"
#include "train/loss_scaler.hpp"
#include "train/trainer_state.hpp"
#include "unit/cli_util.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;
using ax::test::Harness;
using ax::test::make_run_dir;
using ax::train::LossScaleOptions;
using ax::train::LossScaler;

namespace {

std::vector<nlohmann::json> records(const fs::path& dir) { return ax::test::step_records(dir / "out" / "metrics.jsonl"); }

// The harness's TinyLM computing in fp16, with loss scaling (`opts`) or without.
void fp16(Harness& h, std::optional<LossScaleOptions> opts, double loss_weight) {
  h.model.compute = at::kHalf;
  h.model.loss_weight = loss_weight;
  h.setup.loss_scaling = opts;
}

}  // namespace

TEST_CASE("loss scaler: GradScaler's rule: unscale and flag inf/NaN, back off on a bad step, grow after growth_interval good ones") {
  LossScaleOptions o;
  o.growth_interval = 3;
  LossScaler s(o, at::kCPU);
  CHECK(s.scale_tensor().item<float>() == 65536.f);
  CHECK(s.scale(at::ones({}) * 3).item<float>() == 3 * 65536.f);

  std::vector<at::Tensor> g{at::full({2}, 65536.f), at::full({3}, 2 * 65536.f, at::kDouble)};
  at::Tensor inf = s.unscale(g);
  CHECK(inf.item<float>() == 0);
  CHECK(at::equal(g[0], at::ones({2})));
  CHECK(at::equal(g[1], at::full({3}, 2.0, at::kDouble)));
  for (float bad : {std::numeric_limits<float>::infinity(), NAN}) {
    std::vector<at::Tensor> h{at::ones({2}), at::tensor({1.f, bad})};
    CHECK(s.unscale(h).item<float>() == 1);
  }
  // found_inf sequence -> (scale, growth tracker), as torch._amp_update_scale_ on these defaults gives them.
  const std::vector<std::tuple<float, float, int>> steps{
      {0, 65536, 1}, {0, 65536, 2}, {0, 131072, 0}, {1, 65536, 0}, {0, 65536, 1}, {1, 32768, 0}, {1, 16384, 0}};
  for (const auto& [flag, scale, tracker] : steps) {
    s.update(at::full({}, flag));
    CHECK(s.state().scale == scale);
    CHECK(s.state().growth_tracker == tracker);
  }
  s.load({0.25f, 2});
  CHECK(s.scale_tensor().item<float>() == 0.25f);
  s.update(at::zeros({}));
  CHECK(s.state().scale == 0.5f);  // the third good step in a row
  CHECK_THROWS_AS(LossScaler(LossScaleOptions{1, 0.5, 0.5, 10}, at::kCPU), ax::UsageError);  // growth must be > 1
}

TEST_CASE("loss scaler: inf gradients skip the AdamW step (parameters, moments and the step count kept) and halve the scale") {
  ax::Registry reg;
  ax::train::register_builtin_optimizers(reg);
  at::Tensor p = at::tensor({1.f, -2.f, 3.f}).set_requires_grad(true);
  auto opt = reg.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "adamw")->create({{{p}, 0.0}}, toml::table{});
  LossScaler s(LossScaleOptions{}, at::kCPU);
  auto step = [&](float g0) {
    p.mutable_grad() = at::tensor({g0, 1.f, 1.f}) * s.scale_tensor();
    at::Tensor inf = s.unscale({p.mutable_grad()});
    opt->step(1e-2, inf);
    opt->zero_grad();
    s.update(inf);
    return inf.item<float>();
  };
  CHECK(step(0.5f) == 0);
  const at::Tensor after_good = p.detach().clone();
  const auto state = opt->state_dict();
  CHECK(state.at("step").item<int64_t>() == 1);
  CHECK(step(std::numeric_limits<float>::infinity()) == 1);
  CHECK(at::equal(p.detach(), after_good));
  const auto skipped = opt->state_dict();
  CHECK(skipped.at("step").item<int64_t>() == 1);
  for (const auto& [k, t] : state) CHECK(at::equal(t, skipped.at(k)));
  CHECK(s.state().scale == 32768.f);
  CHECK(s.state().growth_tracker == 0);
  CHECK(step(0.5f) == 0);
  CHECK(opt->state_dict().at("step").item<int64_t>() == 2);
  CHECK(s.state().scale == 32768.f);
}

// Gradients of ~1e-9 and below (a loss weighted by 1e-7): below half fp16's smallest subnormal (6e-8) they round
// to zero, unless the loss is scaled first. The step's gradient norm (taken after unscaling) against the fp32 run's.
TEST_CASE("trainer fp16: loss scaling keeps tiny gradients that underflow in fp16 without it") {
  auto dir = make_run_dir("train_fp16_tiny", "");
  std::vector<std::vector<double>> norms;
  for (int mode : {0, 1, 2}) {  // fp32; fp16 with scaling; fp16 without
    Harness h(dir, {"train.max_steps=3", "checkpoint.every_steps=0", "eval.every_steps=0",
                    "run.output_dir=\"out" + std::to_string(mode) + "\""});
    h.model.loss_weight = 1e-7;
    if (mode > 0) fp16(h, mode == 1 ? std::optional<LossScaleOptions>(LossScaleOptions{}) : std::nullopt, 1e-7);
    h.run();
    std::vector<double> n;
    for (const auto& r : ax::test::step_records(dir / ("out" + std::to_string(mode)) / "metrics.jsonl")) {
      n.push_back(r["grad_norm"].get<double>());
      CHECK(r.contains("loss_scale") == (mode == 1));
      if (mode == 1) CHECK(r["skipped"] == false);
    }
    REQUIRE(n.size() == 3);
    norms.push_back(n);
  }
  const double fp32 = norms[0][0], scaled = norms[1][0], unscaled = norms[2][0];
  MESSAGE("first step's gradient norm: fp32 ", fp32, ", fp16 scaled ", scaled, ", fp16 unscaled ", unscaled);
  CHECK(std::abs(scaled - fp32) <= 1e-2 * fp32);
  CHECK(unscaled <= 0.1 * fp32);  // underflowed
  ax::test::remove_tree(dir);
}

// A loss weighted by 100: at the initial scale 2^16 the fp16 gradients overflow. Those steps are skipped and the
// scale halves until it fits; the optimizer counts only the steps it took.
TEST_CASE("trainer fp16: inf gradients skip the step, halve the scale, and say so in metrics.jsonl and the log") {
  auto dir = make_run_dir("train_fp16_inf", "");
  Harness h(dir, {"train.max_steps=8", "eval.every_steps=0", "checkpoint.every_steps=0"});
  fp16(h, LossScaleOptions{}, 100);
  h.run();
  const auto recs = records(dir);
  REQUIRE(recs.size() == 8);
  CHECK(recs[0]["skipped"] == true);
  CHECK(recs[0]["loss_scale"] == 65536.0);
  CHECK(recs[0]["grad_norm"].is_null());
  int64_t skipped = 0;
  double scale = 65536.0;
  for (const auto& r : recs) {
    CAPTURE(r.dump());
    CHECK(r["loss_scale"].get<double>() == scale);
    CHECK(std::isfinite(r["loss"].get<double>()));
    if (r["skipped"] == true) {
      ++skipped;
      scale /= 2;
    } else {
      CHECK(r["grad_norm"].is_number());
    }
  }
  CHECK(skipped >= 1);
  CHECK(skipped < 8);
  auto ck = ax::train::load_checkpoint(ax::train::find_latest_checkpoint((dir / "out").string()));
  CHECK(ck.optimizer.at("step").item<int64_t>() == 8 - skipped);
  REQUIRE(ck.state.loss_scale);
  CHECK(ck.state.loss_scale->scale == static_cast<float>(scale));
  ax::test::remove_tree(dir);
}

// The scaler's state (scale, growth tracker) goes into trainer_state.json and comes back bitwise: with a small
// growth_interval and a loss that overflows now and then, the scale moves during the run, and a resumed run
// repeats the uninterrupted one bit for bit (losses, scales, parameters).
TEST_CASE("trainer fp16: resuming from any checkpoint repeats the run bitwise, loss scale included") {
  auto dir = make_run_dir("train_fp16_resume", "");
  LossScaleOptions o;
  o.init_scale = 1 << 24;
  o.growth_interval = 2;
  Harness full(dir, {});
  fp16(full, o, 1);
  auto a = full.run();
  REQUIRE(a.losses.size() == 12);
  const auto want = records(dir);
  std::set<double> scales;
  for (const auto& r : want) scales.insert(r["loss_scale"].get<double>());
  CHECK(scales.size() >= 3);  // it backed off and grew
  for (int from : {4, 8}) {
    CAPTURE(from);
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", from);
    const fs::path ck = dir / "out" / "checkpoints" / name;
    const auto state = ax::train::load_checkpoint(ck.string()).state;
    REQUIRE(state.loss_scale);
    CHECK(state.loss_scale->scale == static_cast<float>(want[from]["loss_scale"].get<double>()));
    const std::string out = "out_resumed_" + std::to_string(from);
    Harness resumed(dir, {"run.output_dir=" + out, "checkpoint.resume_from=" + ck.string()});
    fp16(resumed, o, 1);
    auto b = resumed.run();
    REQUIRE(b.losses.size() == static_cast<std::size_t>(12 - from));
    for (std::size_t i = 0; i < b.losses.size(); ++i) CHECK(b.losses[i] == a.losses[from + i]);  // bitwise
    const auto got = ax::test::step_records(dir / out / "metrics.jsonl");
    REQUIRE(got.size() == static_cast<std::size_t>(12 - from));  // a fresh output dir: the resumed steps' records
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i]["loss_scale"] == want[from + i]["loss_scale"]);
      CHECK(got[i]["skipped"] == want[from + i]["skipped"]);
    }
    for (const auto& [n, p] : full.model.trainable_parameters()) CHECK(at::equal(p, resumed.model.w(n)));
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("trainer_state.json: loss_scale is checked on load") {
  ax::train::TrainerState s;
  s.step = 2;
  s.steps_per_epoch = 4;
  s.total_steps = 4;
  s.step_in_epoch = 2;
  s.loss_scale = ax::train::LossScaleState{32768.f, 7};
  const nlohmann::json j = s.to_json();
  auto back = ax::train::parse_trainer_state(j, "t.json", 2);
  REQUIRE(back.loss_scale);
  CHECK(back.loss_scale->scale == 32768.f);
  CHECK(back.loss_scale->growth_tracker == 7);
  auto error = [&](const nlohmann::json& ls) {
    nlohmann::json bad = j;
    bad["loss_scale"] = ls;
    try {
      ax::train::parse_trainer_state(bad, "t.json", 2);
    } catch (const ax::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error({{"scale", 0.1}, {"growth_tracker", 0}}) == "t.json: field 'loss_scale.scale' = 0.1 is not a finite float32 value > 0");
  CHECK(error({{"scale", -2.0}, {"growth_tracker", 0}}).find("'loss_scale.scale'") != std::string::npos);
  CHECK(error({{"scale", 2.0}, {"growth_tracker", -1}}).find("'loss_scale.growth_tracker'") != std::string::npos);
  CHECK(error({{"scale", 2.0}}).find("'loss_scale'") != std::string::npos);
}

TEST_CASE("trainer fp16: trainable parameters in fp16 (no fp32 master weights) are refused") {
  auto dir = make_run_dir("train_fp16_masters", "");
  Harness h(dir, {});
  fp16(h, LossScaleOptions{}, 1);
  {
    at::NoGradGuard ng;
    for (auto& [n, p] : h.model.trainable_parameters())
      if (n == "norm.weight") p.set_data(p.to(at::kHalf));
  }
  CHECK_THROWS_WITH_AS(h.run(), doctest::Contains("'norm.weight' is Half"), ax::UsageError);
  ax::test::remove_tree(dir);
}

// Through the CLI: model.dtype = "fp16" turns the scaler on (the log says so, metrics.jsonl has its fields);
// validate refuses what fp16 cannot train on (fp16 LoRA factors).
TEST_CASE("CLI: model.dtype = fp16 trains with loss scaling; fp16 LoRA factors are refused at validate") {
  auto dir = ax::test::setup_run("cli_fp16", "max_steps = 3\n");
  const fs::path log = dir / "run.log";
  const int rc = ax::test::run({"run", "--config", (dir / "run.toml").string(), "--set", "model.dtype=\"fp16\""}, log);
  const std::string text = ax::test::slurp(log);
  REQUIRE_MESSAGE(rc == 0, text);
  CHECK(text.find("fp16: dynamic loss scaling (initial scale 65536") != std::string::npos);
  const auto recs = ax::test::step_records(dir / "out" / "metrics.jsonl");
  REQUIRE(recs.size() == 3);
  for (const auto& r : recs) {
    CHECK(r.contains("loss_scale"));
    CHECK(r.contains("skipped"));
  }
  const int v = ax::test::run({"validate", "--config", (dir / "run.toml").string(), "--set", "model.dtype=\"fp16\"", "--set",
                               "lora.dtype=\"compute\"", "--set", "run.output_dir=\"out2\""},
                              dir / "validate.log");
  CHECK(v == 2);
  CHECK(ax::test::slurp(dir / "validate.log").find("lora.dtype = \"compute\" with model.dtype = \"fp16\"") != std::string::npos);
  ax::test::remove_tree(dir);
}
