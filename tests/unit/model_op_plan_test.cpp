// One source of truth for the kernels a model calls: for every family preset (and the packed weight formats),
// a training step (forward for the loss, backward) and a forward for logits run through backends that record
// every call (op, weight format, layout), and the calls recorded are exactly the plan check_model gives — the
// plan `validate`, `plugins explain` and kernels.strict resolve. Then, through `validate`'s own check, every
// op of every preset's plan with only a backend the device cannot run under kernels.strict is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/model_check.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_ce.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "axengine/training.hpp"
#include "models/hf_config.hpp"
#include "test_util.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using ax::OpCall;

namespace {

// What the recording backends saw, as the calls a KernelSet query names.
struct Recorder {
  std::mutex mu;
  std::set<OpCall> calls;
  void add(const char* op, ax::ops::WeightFormat format, const std::string& layout) { add(op, ax::ops::to_string(format), layout); }
  void add(const char* op, const std::string& format = "", const std::string& layout = "") {
    std::lock_guard<std::mutex> lock(mu);
    calls.insert(OpCall{op, format, layout});
  }
  std::set<OpCall> take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(calls, {});
  }
};

// Each forwards to the registry's `reference` backend after recording the call.
template <class Op>
struct Recording : Op {
  Recording(std::shared_ptr<Op> ref, Recorder* rec) : ref_(std::move(ref)), rec_(rec) {}
  std::shared_ptr<Op> ref_;
  Recorder* rec_;
};

struct RecLinearLora : Recording<ax::ops::LinearLora> {
  using Recording::Recording;
  at::Tensor run_forward(const ax::ops::LinearLoraArgs& a) override {
    rec_->add("linear.lora", a.weight.format, "");
    return ref_->forward(a);
  }
  ax::ops::LinearLoraGrads run_backward(const ax::ops::LinearLoraArgs& a, const ax::ops::LinearLoraBackwardArgs& b) override {
    rec_->add("linear.lora", a.weight.format, "");
    return ref_->backward(a, b);
  }
};
struct RecNormRope : Recording<ax::ops::NormRope> {
  using Recording::Recording;
  at::Tensor run_forward(const ax::ops::NormRopeArgs& a) override {
    rec_->add("norm_rope");
    return ref_->forward(a);
  }
  ax::ops::NormRopeGrads run_backward(const ax::ops::NormRopeArgs& a, const ax::ops::NormRopeBackwardArgs& b) override {
    rec_->add("norm_rope");
    return ref_->backward(a, b);
  }
};
struct RecAttention : Recording<ax::ops::Attention> {
  using Recording::Recording;
  ax::ops::AttentionResult run_forward(const ax::ops::AttentionArgs& a) override {
    rec_->add("attention", "", a.sinks.defined() ? "sinks" : "");
    return ref_->forward(a);
  }
  ax::ops::AttentionGrads run_backward(const ax::ops::AttentionArgs& a, const ax::ops::AttentionBackwardArgs& b) override {
    rec_->add("attention", "", a.sinks.defined() ? "sinks" : "");
    return ref_->backward(a, b);
  }
};
struct RecRmsNorm : Recording<ax::ops::RmsNorm> {
  using Recording::Recording;
  ax::ops::RmsNormResult run_forward(const ax::ops::RmsNormArgs& a) override {
    rec_->add("rms_norm");
    return ref_->forward(a);
  }
  ax::ops::RmsNormGrads run_backward(const ax::ops::RmsNormArgs& a, const ax::ops::RmsNormBackwardArgs& b) override {
    rec_->add("rms_norm");
    return ref_->backward(a, b);
  }
};
struct RecSwiglu : Recording<ax::ops::Swiglu> {
  using Recording::Recording;
  at::Tensor run_forward(const ax::ops::SwigluArgs& a) override {
    rec_->add("swiglu");
    return ref_->forward(a);
  }
  ax::ops::SwigluGrads run_backward(const ax::ops::SwigluArgs& a, const ax::ops::SwigluBackwardArgs& b) override {
    rec_->add("swiglu");
    return ref_->backward(a, b);
  }
};
struct RecLinearCe : Recording<ax::ops::LinearCe> {
  using Recording::Recording;
  ax::ops::LinearCeResult run_forward(const ax::ops::LinearCeArgs& a) override {
    rec_->add("linear_ce");
    return ref_->forward(a);
  }
  at::Tensor run_backward(const ax::ops::LinearCeArgs& a, const ax::ops::LinearCeBackwardArgs& b) override {
    rec_->add("linear_ce");
    return ref_->backward(a, b);
  }
};
struct RecLinearAttention : Recording<ax::ops::LinearAttention> {
  using Recording::Recording;
  ax::ops::LinearAttentionResult run_forward(const ax::ops::LinearAttentionArgs& a) override {
    rec_->add("linear_attention");
    return ref_->forward(a);
  }
  ax::ops::LinearAttentionGrads run_backward(const ax::ops::LinearAttentionArgs& a,
                                             const ax::ops::LinearAttentionBackwardArgs& b) override {
    rec_->add("linear_attention");
    return ref_->backward(a, b);
  }
};
struct RecCausalConv1d : Recording<ax::ops::CausalConv1d> {
  using Recording::Recording;
  ax::ops::CausalConv1dResult run_forward(const ax::ops::CausalConv1dArgs& a) override {
    rec_->add("causal_conv1d");
    return ref_->forward(a);
  }
  ax::ops::CausalConv1dGrads run_backward(const ax::ops::CausalConv1dArgs& a, const ax::ops::CausalConv1dBackwardArgs& b) override {
    rec_->add("causal_conv1d");
    return ref_->backward(a, b);
  }
};
// Both projections' formats: a backend must serve the pair (skip_modules may keep one dense).
struct RecMoeMlp : Recording<ax::ops::MoeMlp> {
  using Recording::Recording;
  void record(const ax::ops::MoeMlpArgs& a) {
    const std::string layout = a.layout == ax::ops::ExpertLayout::ENK ? "ENK" : "EKN";
    rec_->add("moe.mlp", a.gate_up.format, layout);
    rec_->add("moe.mlp", a.down.format, layout);
  }
  ax::ops::MoeMlpResult run_forward(const ax::ops::MoeMlpArgs& a) override {
    record(a);
    return ref_->forward(a);
  }
  ax::ops::MoeMlpGrads run_backward(const ax::ops::MoeMlpArgs& a, const ax::ops::MoeMlpBackwardArgs& b) override {
    record(a);
    return ref_->backward(a, b);
  }
};

// The built-ins plus a `recording` backend of every op a model can call, which the KernelSet below is
// restricted to (strict): a call the model makes through any other path would fail, not go unrecorded.
struct RecordingSetup {
  ax::Registry registry;
  Recorder recorder;
  RecordingSetup() {
    ax::register_builtins(registry);
    add<ax::ops::LinearLora, RecLinearLora>();
    add<ax::ops::NormRope, RecNormRope>();
    add<ax::ops::Attention, RecAttention>();
    add<ax::ops::RmsNorm, RecRmsNorm>();
    add<ax::ops::Swiglu, RecSwiglu>();
    add<ax::ops::LinearCe, RecLinearCe>();
    add<ax::ops::MoeMlp, RecMoeMlp>();
    add<ax::ops::LinearAttention, RecLinearAttention>();
    add<ax::ops::CausalConv1d, RecCausalConv1d>();
  }
  template <class Op, class Rec>
  void add() {
    ax::Provider p;
    p.info.kind = ax::ProviderKind::kernel;
    p.info.op = Op::kOp;
    p.info.name = "recording";
    p.object = std::shared_ptr<Op>(std::make_shared<Rec>(registry.kernel<Op>("reference"), &recorder));
    registry.add(std::move(p));
  }
  std::shared_ptr<ax::KernelSet> kernels() const {
    ax::KernelPreferences prefs;
    for (const auto& op : ax::known_ops()) prefs.prefer[op.id] = {"recording"};
    prefs.strict = true;
    return std::make_shared<ax::KernelSet>(registry, prefs, ax::DeviceInfo{});
  }
};

// Two rows of 8 tokens with labels; a Qwen2.5-VL batch also holds one 2x2-patch image (one merged token).
ax::Batch batch_for(const fs::path& model_dir) {
  const auto cfg = ax::models::read_json_file((model_dir / "config.json").string());
  const int64_t B = 2, S = 8;
  const auto& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  const int64_t vocab = std::min<int64_t>(200, text["vocab_size"].get<int64_t>());  // below the special tokens
  at::Tensor ids = (at::arange(B * S, at::kLong) * 7 + 3).remainder(vocab).reshape({B, S});
  ax::Batch b;
  if (cfg.value("model_type", "") == "qwen2_5_vl") {
    ids[0][3] = cfg["image_token_id"].get<int64_t>();
    const int64_t patch_dim = 3 * 2 * 14 * 14;  // the preset's tower: 3 channels, temporal 2, 14 x 14 patches
    b.extras["pixel_values"] = at::randn({4, patch_dim}, at::kFloat);
    b.extras["image_grid_thw"] = at::tensor({int64_t(1), int64_t(2), int64_t(2)}, at::kLong).reshape({1, 3});
  }
  b.input_ids = ids;
  b.labels = ids.clone();
  b.position_ids = at::arange(S, at::kLong).repeat({B, 1});
  return b;
}

struct PlanCase {
  std::string what;
  fs::path dir;
  ax::WeightPolicy weights;
};

// Loads `c` with a fresh LoRA through the recording backends, runs a training step and a logits forward, and
// checks the calls against the plan check_model gives for the same options.
void check_plan_is_what_runs(const PlanCase& c) {
  CAPTURE(c.what);
  RecordingSetup setup;
  const auto cfg = ax::models::read_json_file((c.dir / "config.json").string());
  ax::LoraSpec lora;
  const std::string type = cfg.value("model_type", "");
  lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  if (type == "deepseek_v3") lora.targets = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};  // MLA
  if (type == "mixtral") lora.targets.insert(lora.targets.end(), {"w1", "w3", "w2"});  // the experts, Mixtral's names
  else if (type == "gpt_oss") lora.targets.insert(lora.targets.end(), {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"});
  else lora.targets.insert(lora.targets.end(), {"gate_proj", "up_proj", "down_proj"});
  if (type == "qwen3_5_text" || type == "qwen3_5_moe_text")  // the Gated DeltaNet layers' projections
    lora.targets.insert(lora.targets.end(), {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"});
  if (type == "qwen3_next")  // its fused ones
    lora.targets.insert(lora.targets.end(), {"in_proj_qkvz", "in_proj_ba", "out_proj", "shared_expert_gate"});
  lora.r = 4;
  lora.alpha = 8;
  ax::ModelLoadOptions o;
  o.dir = c.dir.string();
  o.kernels = setup.kernels();
  o.lora = lora;
  o.weights = c.weights;
  const ax::ModelCheck check = ax::check_model(setup.registry, o);
  const std::set<OpCall> plan(check.ops.begin(), check.ops.end());
  REQUIRE(plan.size() == check.ops.size());  // each call once

  auto model = ax::load_model(setup.registry, o);
  CHECK(setup.recorder.take().empty());  // loading resolves, it calls nothing
  const ax::Batch batch = batch_for(c.dir);
  model->set_training(true);
  ax::ModelOutput out = model->forward(batch, /*want_logits=*/false);
  out.loss.backward();
  const std::set<OpCall> step = setup.recorder.take();
  {
    c10::AutoGradMode off(false);
    model->set_training(false);
    out = model->forward(batch, /*want_logits=*/true);
  }
  const std::set<OpCall> logits = setup.recorder.take();

  std::set<OpCall> recorded = step;
  recorded.insert(logits.begin(), logits.end());
  auto show = [](const std::set<OpCall>& s) {
    std::vector<std::string> v;
    for (const auto& x : s) v.push_back(ax::str(x.op, "/", x.format, "/", x.layout));
    return ax::join(v, ", ");
  };
  INFO("plan:     " << show(plan));
  INFO("recorded: " << show(recorded));
  const bool same = recorded == plan;
  CHECK(same);
  // The loss alone goes through linear_ce; logits through linear.lora's dense lm_head, never linear_ce.
  CHECK(step.count(OpCall{"linear_ce", "", ""}) == 1);
  CHECK(logits.count(OpCall{"linear_ce", "", ""}) == 0);
  CHECK(logits.count(OpCall{"linear.lora", "dense", ""}) == 1);
  const bool packs = c.weights.format != "dense";
  CHECK(check.quantize == (packs ? c.weights.format : std::string()));
}

const std::vector<std::string>& presets() {
  static const std::vector<std::string> p = {"tiny-llama",   "tiny-qwen2",  "tiny-mistral", "tiny-qwen3",   "tiny-qwen3-moe",
                                             "tiny-mixtral", "tiny-gemma3", "tiny-olmoe",   "tiny-gpt-oss", "tiny-qwen3_5", "tiny-qwen3_5-moe", "tiny-qwen3-next",
                                             "tiny-glm4-moe", "tiny-deepseek-v3", "tiny-qwen2_5-vl", "tiny-qwen3-vl", "tiny-qwen3-vl-moe",
                                             "tiny-gemma3-mm"};
  return p;
}

}  // namespace

TEST_CASE("op plan: every family preset calls exactly the ops its plan lists (training step and logits, LoRA on)") {
  const fs::path dir = ax::test::scratch_dir("op_plan_presets");
  // Every preset init-model offers but the benchmark's (too big for a test), whose family tiny-qwen3-moe has.
  std::vector<std::string> offered;
  for (const auto& p : ax::model_presets())
    if (p.rfind("bench-", 0) != 0) offered.push_back(p);
  CHECK(offered == presets());
  for (const auto& preset : presets()) {
    ax::init_model_dir(preset, (dir / preset).string(), 7);
    check_plan_is_what_runs({preset, dir / preset, {}});
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("op plan: packed bases call their formats' kernels as planned (nf4, mxfp4, nvfp4, skip_modules, pre-quantised)") {
  const fs::path dir = ax::test::scratch_dir("op_plan_formats");
  for (const char* preset : {"tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma3"})
    ax::init_model_dir(preset, (dir / preset).string(), 7);
  auto policy = [](const std::string& format, std::vector<std::string> skip = {}) {
    ax::WeightPolicy w;
    w.format = format;
    w.skip_modules = std::move(skip);
    return w;
  };
  const std::string data = AXENGINE_TEST_DATA_DIR;
  const std::vector<PlanCase> cases = {
      {"llama nf4", dir / "tiny-llama", policy("nf4")},
      {"llama nvfp4, o_proj kept dense", dir / "tiny-llama", policy("nvfp4", {"o_proj"})},
      {"qwen3-moe mxfp4", dir / "tiny-qwen3-moe", policy("mxfp4")},
      {"qwen3-moe nf4, experts' down_proj kept dense", dir / "tiny-qwen3-moe", policy("nf4", {"experts.down_proj"})},
      {"gpt-oss nvfp4", dir / "tiny-gpt-oss", policy("nvfp4")},
      {"gemma3 nf4", dir / "tiny-gemma3", policy("nf4")},
      // Stored packed: bitsandbytes nf4 (one down_proj stored dense), gpt-oss's MXFP4 experts.
      {"qwen3 bitsandbytes nf4", fs::path(data) / "bnb/qwen3_nf4", {}},
      {"gpt-oss mxfp4 checkpoint", fs::path(data) / "models/gpt_oss_mxfp4", {}},
  };
  for (const auto& c : cases) check_plan_is_what_runs(c);
  ax::test::remove_tree(dir);
}

TEST_CASE("op plan: under kernels.strict validate's check refuses every op of every preset's plan that has no backend here") {
  const fs::path dir = ax::test::scratch_dir("op_plan_strict");
  {
    std::ofstream rows(dir / "train.jsonl");
    for (int i = 0; i < 20; ++i) rows << "{\"prompt\": \"" << i << "+1=\", \"answer\": \"" << i + 1 << "\"}\n";
  }
  ax::Registry builtins;
  ax::register_builtins(builtins);
  for (const auto& preset : presets()) {
    CAPTURE(preset);
    const fs::path model = dir / preset;
    ax::init_model_dir(preset, model.string(), 7);
    ax::ModelLoadOptions o;
    o.dir = model.string();
    o.kernels = std::make_shared<ax::KernelSet>(builtins, ax::KernelPreferences{}, ax::DeviceInfo{});
    std::set<std::string> ops;
    for (const auto& c : ax::check_model(builtins, o).ops) ops.insert(c.op);
    // The control: the same config with no list passes; each op listed with only `cuda_only` is refused.
    std::vector<std::string> lists{""};
    for (const auto& op : ops) lists.push_back(op);
    for (const auto& op : lists) {
      CAPTURE(op);
      std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\n[device]\ntype = \"cpu\"\n[model]\npath = \"" << preset << "\"\n"
                                      << "[data]\nsequence_len = 32\ncache_dir = \"cache\"\n"
                                      << "[[datasets]]\ntype = \"completion\"\npath = \"train.jsonl\"\nprompt_field = \"prompt\"\n"
                                      << "text_field = \"answer\"\n[lora]\ntargets = "
                                      << (preset == "tiny-deepseek-v3" ? "[\"kv_b_proj\", \"o_proj\"]" : "[\"q_proj\", \"v_proj\"]")
                                      << "\n[kernels]\nstrict = true\n"
                                      << (op.empty() ? "" : ax::str(ax::find_op(op)->config_key, " = [\"cuda_only\"]\n"));
      ax::StartOptions start;
      start.config_file = (dir / "run.toml").string();
      start.plugin_files = {ax_test::test_plugin("test_cuda_only")};
      start.discover = false;
      auto engine = ax::Engine::start(start);
      if (op.empty()) {
        CHECK_NOTHROW(ax::check_run(*engine, ax::TrainOptions{}));
        continue;
      }
      CHECK_THROWS_WITH_AS(ax::check_run(*engine, ax::TrainOptions{}),
                           doctest::Contains(ax::str("kernels.strict: no backend for ", op, " (dtype fp32").c_str()), ax::UsageError);
    }
  }
  ax::test::remove_tree(dir);
}
