// The run config: strict binding with locations and suggestions, overrides, and docs kept in sync.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>

#include "axengine/config.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "test_util.hpp"

using namespace ax_test;

namespace {

// Loads `text` as a config file and returns the error message ("" when it loaded).
std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  TempDir dir;
  write_file(dir / "run.toml", text);
  try {
    ax::load_config(dir / "run.toml", sets);
  } catch (const ax::ConfigError& e) {
    std::string msg = e.what();
    auto pos = msg.find("run.toml");
    return pos == std::string::npos ? msg : msg.substr(pos);  // drop the temp dir
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: unknown keys name file:line:column and the closest key") {
  CHECK(error_of("[run]\nseed = 1\nouput_dir = \"x\"\n") == "run.toml:3:1: unknown key 'run.ouput_dir' (did you mean 'run.output_dir'?)");
  CHECK(error_of("[modle]\npath = \"x\"\n") == "run.toml:1:2: unknown key 'modle' (did you mean 'model'?)");
  CHECK(error_of("[kernels]\nmoe_mpl = [\"reference\"]\n") == "run.toml:2:1: unknown key 'kernels.moe_mpl' (did you mean 'kernels.moe_mlp'?)");
  CHECK(error_of("[run]\nxyzzy = 1\n") == "run.toml:2:1: unknown key 'run.xyzzy'");
}

TEST_CASE("config: wrong types and values name the location") {
  CHECK(error_of("[run]\nseed = \"7\"\n") == "run.toml:2:8: 'run.seed' must be an integer, not a string");
  CHECK(error_of("[model]\ndtype = \"bf61\"\n") ==
        "run.toml:2:9: 'model.dtype' is \"bf61\", expected one of auto, fp32, bf16, fp16 (did you mean \"bf16\"?)");
  CHECK(error_of("[kernels]\nmoe_mlp = [\"a\", 3]\n") == "run.toml:2:17: 'kernels.moe_mlp' must be a list of strings; found an integer");
  CHECK(error_of("[kernels]\nmoe_mlp = []\n") == "run.toml:2:11: 'kernels.moe_mlp' is empty");
  CHECK(error_of("[kernels.arch.hopper]\nmoe_mlp = [\"x\"]\n") == "run.toml:1:1: 'kernels.arch.hopper' is not a CUDA arch like sm_90 or sm_120");
  CHECK(error_of("run = 3\n") == "run.toml:1:7: 'run' must be a table, not an integer");
  CHECK(error_of("[run\n").rfind("run.toml:1:", 0) == 0);  // TOML syntax errors keep their location
}

TEST_CASE("config: values bind into typed sections, paths resolve against the config file") {
  TempDir dir;
  write_file(dir / "sub/run.toml",
             "[run]\nseed = 7\noutput_dir = \"out\"\n[model]\npath = \"../models/tiny\"\ndtype = \"bf16\"\n"
             "[plugins]\npaths = [\"plugins\", \"/abs/p.so\"]\n"
             "[kernels]\nstrict = true\nmoe_mlp = [\"scattermoe\"]\nnorm_rope = [\"fused_attn\"]\n"
             "[kernels.arch.sm_120]\nmoe_mlp = [\"reference\"]\n");
  auto c = ax::load_config(dir / "sub/run.toml");
  CHECK(c.run.seed == 7);
  CHECK(c.run.output_dir == dir / "sub/out");
  CHECK(c.model.path == dir / "models/tiny");
  CHECK(c.model.dtype == "bf16");
  CHECK(c.plugins.paths == std::vector<std::string>{dir / "sub/plugins", "/abs/p.so"});
  CHECK(c.kernels.strict);
  CHECK(c.kernels.prefer.at("moe.mlp") == std::vector<std::string>{"scattermoe"});
  CHECK(c.kernels.prefer.at("norm_rope") == std::vector<std::string>{"fused_attn"});
  CHECK(c.kernels.by_arch.at(120).at("moe.mlp") == std::vector<std::string>{"reference"});
}

TEST_CASE("config: --set overrides and is validated like the file") {
  TempDir dir;
  write_file(dir / "run.toml", "[run]\nseed = 1\n");
  auto c = ax::load_config(dir / "run.toml", {"run.seed=9", "model.dtype=fp16", "kernels.moe_mlp=[\"a\",\"b\"]"});
  CHECK(c.run.seed == 9);
  CHECK(c.model.dtype == "fp16");  // a bare word is taken as a string
  CHECK(c.kernels.prefer.at("moe.mlp") == std::vector<std::string>{"a", "b"});
  CHECK(error_of("[run]\n", {"run.seed=abc"}) == "--set: 'run.seed' must be an integer, not a string");
  CHECK(error_of("[run]\n", {"run.sede=3"}).find("unknown key 'run.sede' (did you mean 'run.seed'?)") != std::string::npos);
  CHECK(error_of("[run]\n", {"noequals"}).find("expected KEY=VALUE") != std::string::npos);
  CHECK(error_of("[run]\nseed = 1\n", {"run.seed.x=1"}).find("'run.seed' is not a table") != std::string::npos);
}

TEST_CASE("config: docs/config.md lists every key exactly as the binding code does") {
  std::string doc = read_file(std::string(AXENGINE_SOURCE_DIR) + "/docs/config.md");
  const std::string begin = "<!-- BEGIN GENERATED: axengine validate --schema -->\n";
  const std::string end = "<!-- END GENERATED -->";
  auto b = doc.find(begin), e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  // Regenerate with: scripts/gen-config-docs.sh. The plugin tables are those of the plugins built beside the
  // executable (scattermoe, when nvcc was found), listed after the core sections.
  const std::string generated = doc.substr(b + begin.size(), e - b - begin.size());
  ax::StartOptions o;
  o.exe_dir = AXENGINE_BIN_DIR;
  auto engine = ax::Engine::start(o);
  const auto& tables = engine->plugins->config_tables();
  const bool scattermoe = std::any_of(tables.begin(), tables.end(), [](const auto& t) { return t.plugin == "scattermoe"; });
  if (scattermoe) {
    CHECK(generated == ax::config_reference_markdown(tables));
  } else {
    MESSAGE("scattermoe was not built (no nvcc): only the core sections are compared");
    CHECK(generated.rfind(ax::config_reference_markdown(), 0) == 0);
  }
}

TEST_CASE("cli: validate exit codes, and messages carry the location") {
  TempDir dir;
  write_file(dir / "incomplete.toml", "[run]\nseed = 3\n");
  write_file(dir / "bad.toml", "[run]\nsed = 3\n");
  // Well-formed but nothing to run: validate refuses what run would (validate_cli_test.cpp has the good ones).
  auto r = run(axengine() + " validate --config " + (dir / "incomplete.toml"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("incomplete.toml: [model] path is required") != std::string::npos);
  r = run(axengine() + " validate --config " + (dir / "bad.toml"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("bad.toml:2:1: unknown key 'run.sed' (did you mean 'run.seed'?)") != std::string::npos);
  CHECK(run(axengine() + " validate --config " + (dir / "missing.toml")).exit_code == 2);
  CHECK(run(axengine() + " validate --bogus").exit_code == 2);
  CHECK(run(axengine() + " frobnicate").exit_code == 2);
  CHECK(run(axengine() + " run --help").exit_code == 0);
  CHECK(run(axengine() + " plugins --help").exit_code == 0);
}

TEST_CASE("config: nan and inf are refused in every float key with the location") {
  // Every float key of the schema (the generated reference lists them), written as nan, inf and -inf: TOML
  // allows all three, and range checks like `dropout < 0` let nan through.
  const std::string schema = ax::config_reference_markdown();
  const std::regex row(R"(\| `([a-z_]+(?:\[\])?)\.([a-z_0-9]+)` \| float \|)");
  int keys = 0;
  for (auto it = std::sregex_iterator(schema.begin(), schema.end(), row); it != std::sregex_iterator(); ++it) {
    const std::string section = (*it)[1], key = (*it)[2];
    const bool array = section.size() > 2 && section.substr(section.size() - 2) == "[]";
    const std::string name = array ? section.substr(0, section.size() - 2) : section;
    for (const char* value : {"nan", "inf", "-inf"}) {
      const std::string text = array ? "[[" + name + "]]\ntype = \"completion\"\npath = \"a.jsonl\"\n" + key + " = " + value + "\n"
                                     : "[" + name + "]\n" + key + " = " + value + "\n";
      const int line = array ? 4 : 2;
      CAPTURE(text);
      CHECK(error_of(text) == "run.toml:" + std::to_string(line) + ":" + std::to_string(key.size() + 4) + ": '" + name + "." + key +
                                  "' is " + value + ", must be a finite number");
    }
    ++keys;
  }
  CHECK(keys >= 10);  // data, datasets[], lora, train and optimizer all have some
  CHECK(error_of("[train]\n", {"train.lr=inf"}) == "--set: 'train.lr' is inf, must be a finite number");
}

TEST_CASE("cli: validate and run refuse a nan or inf config value with file:line:column and the key") {
  TempDir dir;
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"[lora]\ndropout = nan\n", "nan.toml:2:11: 'lora.dropout' is nan, must be a finite number"},
           {"[data]\neval_fraction = nan\n", "nan.toml:2:17: 'data.eval_fraction' is nan, must be a finite number"},
           {"[train]\nlr = inf\n", "nan.toml:2:6: 'train.lr' is inf, must be a finite number"}}) {
    write_file(dir / "nan.toml", text);
    for (const char* command : {" validate --config ", " run --config "}) {
      auto r = run(axengine() + command + (dir / "nan.toml"));
      INFO(command, text, r.output);
      CHECK(r.exit_code == 2);
      CHECK(r.output.find(want) != std::string::npos);
    }
  }
}
