// `validate` ≡ the start of `run` for inputs run used to refuse only after validate passed (issue 36, 2): a
// kernel the model calls with no backend under kernels.strict, checkpoint tensors that disagree with
// config.json, config values no run can use, an output_dir a run cannot write. Each is exit 2 at `validate`
// and the same line at `run`, naming the key or the tensor, with nothing written. And config sizes a
// checkpoint cannot back (10^9 layers, a vocabulary, hidden size or expert count beyond the tensors) are
// refused at once by inspect, validate and run.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "test_util.hpp"
#include "unit/tiny_model.hpp"
#include "unit/validate_run_dir.hpp"

using namespace ax_test;

namespace {

std::string line_with(const std::string& output, const std::string& needle) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) return line;
  return "";
}

struct Case {
  std::string what;
  std::string args;    // after --config run.toml
  std::string expect;  // in the one error line, naming the key or the tensor
};

// validate and run both exit 2 with the same line holding `expect`, run without a backtrace and without
// writing its output_dir.
void check_refused(const TempDir& dir, const Case& c) {
  CAPTURE(c.what);
  auto v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " " + c.args);
  auto r = run(env(dir) + axengine() + " run --config " + (dir / "run.toml") + " " + c.args);
  INFO("validate: " << v.output);
  INFO("run: " << r.output);
  CHECK(v.exit_code == 2);
  CHECK(r.exit_code == 2);
  const std::string line = line_with(v.output, c.expect);
  CHECK(!line.empty());
  CHECK(line == line_with(r.output, c.expect));
  CHECK(r.output.find("frame #") == std::string::npos);
  CHECK(!fs::exists(dir.path / "out"));
}

// The tiny Llama's checkpoint with `edit` applied to its tensors, into model dir `name`.
void edited_model(const TempDir& dir, const std::string& name,
                  const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
  fs::copy(dir.path / "model", dir.path / name, fs::copy_options::recursive);
  auto file = ax::safetensors::File::open((dir.path / "model/model.safetensors").string());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& t : file->tensors()) tensors.emplace_back(t.name, file->get(t.name));
  edit(tensors);
  fs::remove(dir.path / name / "model.safetensors");
  ax::safetensors::save((dir.path / name / "model.safetensors").string(), tensors);
}

// The tiny Llama's config.json with `edit` applied, into model dir `name` (weights shared).
void edited_config(const TempDir& dir, const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  fs::copy(dir.path / "model", dir.path / name, fs::copy_options::recursive);
  auto j = nlohmann::json::parse(read_file(dir / "model/config.json"));
  edit(j);
  write_file(dir / (name + "/config.json"), j.dump(2));
}

}  // namespace

TEST_CASE("validate start: kernels.strict with no backend for rms_norm, swiglu or linear_ce on this device is exit 2") {
  TempDir dir;
  make_run_dir(dir);
  const std::string plugin = "--set kernels.strict=true --set 'plugins.paths=[\"" + test_plugin("test_cuda_only") + "\"]'";
  std::vector<Case> cases;
  for (const char* op : {"rms_norm", "swiglu", "linear_ce"})
    cases.push_back({ax::str(op, " = [cuda_only]"), ax::str(plugin, " --set 'kernels.", op, "=[\"cuda_only\"]' --set device.type=cpu"),
                     ax::str("kernels.strict: no backend for ", op, " (dtype fp32) on cpu from [kernels] — cuda_only: needs cuda")});
  // The issue's own input, where the build has the CUDA plugin (it needs nvcc): listed, and refused on the CPU.
  if (fs::exists(std::string(AXENGINE_PLUGIN_DIR) + "/axengine_fused_attn.so"))
    for (const char* op : {"rms_norm", "swiglu", "linear_ce"})
      cases.push_back({ax::str(op, " = [fused_attn]"), ax::str("--set kernels.strict=true --set 'kernels.", op, "=[\"fused_attn\"]' --set device.type=cpu"),
                       ax::str("kernels.strict: no backend for ", op, " (dtype fp32) on cpu from [kernels] — fused_attn: needs cuda")});
  for (const auto& c : cases) check_refused(dir, c);
}

TEST_CASE("validate start: checkpoint tensors are checked against config.json from the headers") {
  TempDir dir;
  make_run_dir(dir);
  edited_model(dir, "i32", [](auto& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.layers.1.mlp.up_proj.weight") t = t.to(at::kInt);
  });
  edited_model(dir, "swapped", [](auto& ts) {
    for (auto& [n, t] : ts)
      if (n == "model.layers.1.self_attn.k_proj.weight") t = t.t().contiguous();  // [32, 64] stored as [64, 32]
  });
  edited_model(dir, "missing", [](auto& ts) {
    std::erase_if(ts, [](const auto& p) { return p.first == "model.layers.1.post_attention_layernorm.weight"; });
  });
  edited_config(dir, "head_dim", [](nlohmann::json& j) { j["head_dim"] = 8; });  // the tensors hold 16
  edited_config(dir, "layers", [](nlohmann::json& j) { j["num_hidden_layers"] = 3; });  // 2 are stored
  const std::vector<Case> cases = {
      {"a tensor of dtype I32", "--set model.path=i32",
       (dir / "i32/model.safetensors") + ": tensor 'model.layers.1.mlp.up_proj.weight' has non-float dtype I32"},
      {"a tensor stored transposed", "--set model.path=swapped",
       (dir / "swapped/model.safetensors") + ": tensor 'model.layers.1.self_attn.k_proj.weight' has shape [64, 32] but " +
           (dir / "swapped/config.json") + " implies [32, 64]"},
      {"a tensor missing", "--set model.path=missing", "missing tensor 'model.layers.1.post_attention_layernorm.weight'"},
      {"head_dim disagreeing with the tensors", "--set model.path=head_dim",
       (dir / "head_dim/config.json") + ": 'num_attention_heads' x 'head_dim' is 4 x 8 = 32 but " + (dir / "head_dim/model.safetensors") +
           ": tensor 'model.layers.0.self_attn.q_proj.weight' has 64 rows (head_dim 16?)"},
      {"num_hidden_layers above the layers stored", "--set model.path=layers",
       (dir / "layers/config.json") + ": 'num_hidden_layers' is 3 but " + (dir / "layers/model.safetensors") +
           " holds layers 0 to 1 only (no tensor under model.layers.2.)"},
  };
  for (const auto& c : cases) check_refused(dir, c);
}

TEST_CASE("validate start: rms_norm_eps <= 0, a learning rate beyond a float and lora.alpha <= 0 are exit 2 naming the key") {
  TempDir dir;
  make_run_dir(dir);
  edited_config(dir, "eps", [](nlohmann::json& j) { j["rms_norm_eps"] = -1; });
  const std::vector<Case> cases = {
      {"rms_norm_eps = -1", "--set model.path=eps", (dir / "eps/config.json") + ": 'rms_norm_eps' must be a finite number > 0, got -1"},
      {"train.lr = 1e300", "--set train.lr=1e300", "'train.lr' is 1e+300, beyond what a float holds"},
      {"lora.alpha = -16", "--set lora.alpha=-16", "'lora.alpha' must be > 0"},
      {"lora.alpha = 0", "--set lora.alpha=0", "'lora.alpha' must be > 0"},
  };
  for (const auto& c : cases) check_refused(dir, c);
}

TEST_CASE("validate start: an output_dir that is empty, on /proc, an existing file or holds a NUL is exit 2 naming run.output_dir") {
  TempDir dir;
  make_run_dir(dir);
  write_file(dir / "a_file", "not a directory\n");
  const std::string good = good_config();
  auto with_output = [&](const std::string& value) {
    std::string text = good;
    text.replace(text.find("output_dir = \"out\""), 18, "output_dir = " + value);
    return text;
  };
  struct OutCase {
    std::string what, toml_value, expect;
  };
  const std::vector<OutCase> cases = {
      {"empty", "\"\"", "run.output_dir is empty"},
      {"under /proc", "\"/proc/axengine-run\"", "run.output_dir /proc/axengine-run is on /proc, a proc filesystem"},
      {"an existing file", "\"a_file\"", "run.output_dir " + (dir / "a_file") + " exists and is not a directory"},
      {"a NUL byte", "\"out\\u0000x\"", "run.output_dir contains a NUL byte"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    write_file(dir / "run.toml", with_output(c.toml_value));
    check_refused(dir, {c.what, "", c.expect});
    CHECK(read_file(dir / "a_file") == "not a directory\n");
  }
}

TEST_CASE("validate start: config sizes no checkpoint backs are refused at once by inspect, validate and run") {
  TempDir dir;
  make_run_dir(dir);
  REQUIRE(run(env(dir) + axengine() + " init-model --preset tiny-qwen3-moe --out " + (dir / "moe")).exit_code == 0);
  edited_config(dir, "layers_1e9", [](nlohmann::json& j) { j["num_hidden_layers"] = 1000000000; });
  edited_config(dir, "vocab_1e9", [](nlohmann::json& j) { j["vocab_size"] = 1000000000; });
  edited_config(dir, "hidden_1e9", [](nlohmann::json& j) { j["hidden_size"] = 1000000000; });
  fs::copy(dir.path / "moe", dir.path / "experts_1e9", fs::copy_options::recursive);
  {
    auto j = nlohmann::json::parse(read_file(dir / "moe/config.json"));
    j["num_experts"] = 1000000000;
    write_file(dir / "experts_1e9/config.json", j.dump(2));
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"layers_1e9", "'num_hidden_layers' is 1000000000, more than 65536"},
      {"vocab_1e9", "'vocab_size' is 1000000000 but "},
      {"hidden_1e9", "'hidden_size' is 1000000000 but "},
      {"experts_1e9", "'num_experts' is 1000000000 but "},
  };
  for (const auto& [model, expect] : cases) {
    CAPTURE(model);
    // `timeout`: a hang fails the case (exit 124) instead of the suite.
    for (const std::string& cmd : {"inspect " + (dir / model), "validate --config " + (dir / "run.toml") + " --set model.path=" + model,
                                   "run --config " + (dir / "run.toml") + " --set model.path=" + model}) {
      CAPTURE(cmd);
      auto r = run(env(dir) + "timeout 120 " + axengine() + " " + cmd);
      INFO(r.output);
      CHECK(r.exit_code == 2);
      CHECK(r.output.find(expect) != std::string::npos);
    }
  }
  CHECK(!fs::exists(dir.path / "out"));
}

TEST_CASE("validate start: plugins explain and validate list the calls of the config's model, not every op") {
  TempDir dir;
  make_run_dir(dir);
  REQUIRE(run(env(dir) + axengine() + " init-model --preset tiny-gpt-oss --out " + (dir / "gpt-oss")).exit_code == 0);
  // The op column of each line of the table (two spaces, the op, a space).
  auto ops_of = [](const std::string& table) {
    std::set<std::string> ops;
    std::istringstream in(table);
    for (std::string line; std::getline(in, line);)
      if (line.size() > 2 && line.compare(0, 2, "  ") == 0 && line[2] != ' ' && line.compare(2, 3, "op ") != 0)
        ops.insert(line.substr(2, line.find(' ', 2) - 2));
    return ops;
  };
  auto r = run(env(dir) + axengine() + " plugins explain --config " + (dir / "run.toml") + " --set device.type=cpu");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // llama: no q/k norm (plain RoPE, no norm_rope), a dense MLP (swiglu), no experts.
  CHECK(ops_of(r.output) == std::set<std::string>{"attention", "linear.lora", "rms_norm", "swiglu", "linear_ce"});
  r = run(env(dir) + axengine() + " plugins explain --config " + (dir / "run.toml") + " --set device.type=cpu --set model.path=gpt-oss" +
          " --set 'lora.targets=[\"q_proj\", \"v_proj\"]'");  // gpt-oss has no dense MLP
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // gpt-oss: attention with sinks, the experts one moe.mlp call, no dense MLP.
  CHECK(ops_of(r.output) == std::set<std::string>{"attention", "linear.lora", "rms_norm", "linear_ce", "moe.mlp"});
  CHECK(!line_with(r.output, "  attention ").empty());
  CHECK(line_with(r.output, "  attention ").find("fp32,sinks from") != std::string::npos);
  CHECK(line_with(r.output, "  moe.mlp ").find("fp32,dense,ENK from") != std::string::npos);
  // No model named: every op a model may call, as before.
  write_file(dir / "bare.toml", "[kernels]\nstrict = false\n");
  r = run(env(dir) + axengine() + " plugins explain --config " + (dir / "bare.toml") + " --set device.type=cpu");
  CHECK(ops_of(r.output).count("norm_rope") == 1);
  CHECK(ops_of(r.output).count("moe.mlp") == 1);
}
