// [compile]: the allow-list and its setters (the rename sentinel), validation with file:line:column, per-arch
// overrides, the runtime apply, and the pieces of the executor that need no GPU (plugin sources compiled in).
#include <ATen/ATen.h>  // before doctest: c10 defines a CHECK of its own, doctest's must win
#include <doctest/doctest.h>

#include <axengine/builtins.hpp>
#include <axengine/error.hpp>
#include <axengine/registry.hpp>
#include <toml++/toml.h>

#include "allow_list.hpp"
#include "data/static_shapes.hpp"
#include "executor.hpp"
#include "setters.hpp"
#include "tunable.hpp"

using namespace ax::compile;

namespace {

CompileOptions bind_table(const std::string& text, const std::string& file = "run.toml") {
  const toml::table doc = toml::parse(std::string_view(text), std::string_view(file));
  const toml::table* t = doc["compile"].as_table();
  ax::TableBinder binder(t, "compile", ax::BindContext{file});
  CompileOptions o;
  bind_compile(binder, o);
  binder.finish();
  return o;
}

std::string bind_error(const std::string& text) {
  try {
    bind_table(text);
  } catch (const ax::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("compile: every allow-listed key has exactly one setter and every setter a key (rename sentinel)") {
  CHECK(sentinel_mismatch() == "");
  for (const AllowedKey& k : allow_list()) {
    CAPTURE(k.key);
    CHECK(setters().count(k.key) == 1);
    CHECK(std::string(k.doc).size() > 20);
  }
  CHECK(setters().size() == allow_list().size());
}

TEST_CASE("compile: each GPU-facing key's doc says where it was measured") {
  for (const AllowedKey& k : allow_list()) {
    const std::string key = k.key;
    // enabled and cache_dir are switches; warmup_steps and max_graphs shape cuda_graphs (its row holds the figure).
    if (key == "enabled" || key == "cache_dir" || key == "warmup_steps" || key == "max_graphs") continue;
    CAPTURE(key);
    CHECK(std::string(k.doc).find("Measured:") != std::string::npos);
  }
}

TEST_CASE("compile: an absent or disabled table keeps every default") {
  CompileOptions none = bind_table("");
  CHECK_FALSE(none.enabled());
  CHECK(std::get<bool>(none.values.at("cuda_graphs")) == false);
  CHECK(std::get<int64_t>(none.values.at("warmup_steps")) == 3);
  CHECK_FALSE(bind_table("[compile]\nenabled = false\n").enabled());
}

TEST_CASE("compile: an unknown key names file:line:col, the closest key and the allowed list") {
  const std::string e = bind_error("[compile]\nenabled = true\ncuda_graph = true\n");
  CHECK(e.find("run.toml:3:1") != std::string::npos);
  CHECK(e.find("did you mean 'cuda_graphs'") != std::string::npos);
  CHECK(e.find("allowed: enabled, cuda_graphs") != std::string::npos);
}

TEST_CASE("compile: options set while enabled = false are refused") {
  const std::string e = bind_error("[compile]\ntf32 = true\n");
  CHECK(e.find("run.toml:2") != std::string::npos);
  CHECK(e.find("compile.tf32 is set while compile.enabled = false") != std::string::npos);
  CHECK(bind_error("[compile]\n[compile.arch.sm_90]\ntf32 = true\n").find("compile.arch is set while") != std::string::npos);
}

TEST_CASE("compile: wrong types, bounds and conflicts are refused with their location") {
  CHECK(bind_error("[compile]\nenabled = true\ntf32 = 1\n").find("run.toml:3") != std::string::npos);
  CHECK(bind_error("[compile]\nenabled = true\nmax_graphs = 0\n").find("max_graphs") != std::string::npos);
  CHECK(bind_error("[compile]\nenabled = true\ndeterministic = true\ncudnn_benchmark = true\n").find("contradict") !=
        std::string::npos);
  CHECK(bind_error("[compile]\nenabled = true\nstatic_shapes = true\n").find("static_shapes = true pads") != std::string::npos);
}

TEST_CASE("compile: [compile.arch.sm_XX] overrides the per-arch keys for that GPU only") {
  CompileOptions o = bind_table("[compile]\nenabled = true\ntf32 = true\n[compile.arch.sm_86]\ntf32 = false\nautotune_gemm = true\n");
  CHECK(std::get<bool>(o.resolve(90).at("tf32")) == true);
  CHECK(std::get<bool>(o.resolve(86).at("tf32")) == false);
  CHECK(std::get<bool>(o.resolve(86).at("autotune_gemm")) == true);
  CHECK(std::get<bool>(o.resolve(0).at("autotune_gemm")) == false);
  // Not per arch: enabled, cache_dir. Not an arch: sm_x. A conflict inside one arch names it.
  CHECK(bind_error("[compile]\nenabled = true\n[compile.arch.sm_90]\nenabled = false\n").find("unknown key 'compile.arch.sm_90.enabled'") !=
        std::string::npos);
  CHECK(bind_error("[compile]\nenabled = true\n[compile.arch.sm_x]\ntf32 = true\n").find("sm_<digits>") != std::string::npos);
  CHECK(bind_error("[compile]\nenabled = true\ndeterministic = true\n[compile.arch.sm_90]\ncudnn_benchmark = true\n")
            .find("compile.arch.sm_90: deterministic") != std::string::npos);
}

TEST_CASE("compile: the schema is documented from the allow-list") {
  std::vector<ax::ConfigKeyDoc> docs;
  ax::BindContext ctx;
  ctx.docs = &docs;
  ax::TableBinder binder(nullptr, "compile", ctx);
  CompileOptions o;
  bind_compile(binder, o);
  std::vector<std::string> keys;
  for (const auto& d : docs) keys.push_back(d.key);
  for (const AllowedKey& k : allow_list()) {
    CAPTURE(k.key);
    CHECK(std::find(keys.begin(), keys.end(), std::string("compile.") + k.key) != keys.end());
  }
  CHECK(std::find(keys.begin(), keys.end(), "compile.arch.sm_XX.tf32") != keys.end());
}

TEST_CASE("compile: apply sets ATen's global knobs and the executor's settings, and a relative cache_dir follows the config") {
  CompileOptions o = bind_table("[compile]\nenabled = true\ntf32 = true\ncuda_graphs = true\nstatic_shapes = true\nwarmup_steps = 5\n"
                          "cache_dir = \"tune\"\n", "/cfg/run.toml");
  CHECK(std::get<std::string>(o.values.at("cache_dir")) == "/cfg/tune");
  const bool cublas_before = at::globalContext().allowTF32CuBLAS(), cudnn_before = at::globalContext().allowTF32CuDNN();
  Runtime r;
  apply_settings(r, o.resolve(0));
  CHECK(at::globalContext().allowTF32CuBLAS());
  CHECK(r.executor.cuda_graphs);
  CHECK(r.executor.static_shapes);
  CHECK(r.executor.warmup_steps == 5);
  CHECK(r.cache_dir == "/cfg/tune");
  at::globalContext().setAllowTF32CuBLAS(cublas_before);
  at::globalContext().setAllowTF32CuDNN(cudnn_before);
}

TEST_CASE("compile: deterministic turns ATen's deterministic algorithms on and its NaN fill of new tensors off") {
  auto& ctx = at::globalContext();
  const bool algos = ctx.deterministicAlgorithms(), fill = ctx.deterministicFillUninitializedMemory();
  const bool cudnn = ctx.deterministicCuDNN();
  ctx.setDeterministicFillUninitializedMemory(true);  // ATen's default
  Runtime r;
  apply_settings(r, bind_table("[compile]\nenabled = true\ndeterministic = true\n").resolve(0));
  CHECK(ctx.deterministicAlgorithms());
  CHECK(ctx.deterministicCuDNN());
  CHECK_FALSE(ctx.deterministicFillUninitializedMemory());
  ctx.setDeterministicAlgorithms(algos, false);
  ctx.setDeterministicFillUninitializedMemory(fill);
  ctx.setDeterministicCuDNN(cudnn);
}

TEST_CASE("compile: the GEMM tuning file is per GPU model and arch") {
  ax::DeviceInfo d;
  d.type = ax::DeviceInfo::Type::cuda;
  d.arch = 90;
  d.name = "NVIDIA H200";
  CHECK(gemm_tuning_file(d, "/c") == "/c/tunableop_NVIDIA_H200_sm_90.csv");
}

TEST_CASE("compile: backends not declared graph_safe are named as the reason to run eagerly") {
  ax::Registry reg;
  ax::register_builtins(reg);
  ax::Resolution r;
  r.op = "rms_norm";
  r.chosen = "reference";
  ax::Resolution q;
  q.op = "quantize";
  q.chosen = "reference";  // a load step: never in a training step
  const std::string why = graph_unsafe_backends(reg, {r, q});
  CHECK(why == "the selected kernel backend rms_norm/reference is not declared graph_safe");
  CHECK(graph_unsafe_backends(reg, {q}) == "");
}

TEST_CASE("compile: static shapes give every packed micro-batch one shape signature") {
  auto batch = [](std::vector<int32_t> cu) {
    ax::Batch b;
    b.input_ids = at::zeros({1, 8}, at::kLong);
    b.labels = at::zeros({1, 8}, at::kLong);
    b.position_ids = at::zeros({1, 8}, at::kLong);
    b.cu_seqlens = at::tensor(cu, at::kInt);
    b.max_seqlen = 5;
    return b;
  };
  ax::Batch a = batch({0, 3, 8}), b = batch({0, 2, 4, 8});
  CHECK(shape_signature({a}) != shape_signature({b}));
  ax::data::pad_static(a, 4);
  ax::data::pad_static(b, 4);
  CHECK(shape_signature({a}) == shape_signature({b}));
  CHECK(a.cu_seqlens.equal(at::tensor(std::vector<int32_t>{0, 3, 8, 8, 8}, at::kInt)));
  CHECK(a.max_seqlen == 8);
  CHECK_THROWS_AS(ax::data::pad_static(b, 2), ax::RuntimeError);
  CHECK(ax::data::span_capacity({{1, 2}, {3}, {4, 5, 6}}, 2) == 8);
}

namespace {
struct CountingProgram final : ax::StepProgram {
  int runs = 0;
  bool device_lr_used = false;
  at::Tensor run(const std::vector<ax::Batch>&, double, const at::Tensor& lr_device) override {
    ++runs;
    device_lr_used |= lr_device.defined();
    return at::zeros({3}, at::kDouble);
  }
  bool device_lr() const override { return false; }
  void abandon() override {}
};
}  // namespace

TEST_CASE("compile: on the CPU the graph executor declines with its reason and runs every step eagerly") {
  ax::ExecutorContext ctx;  // device: cpu
  Runtime r;
  r.executor.cuda_graphs = true;
  CompileExecutor e(ctx, r);
  CHECK(e.fallback_reason() == "CUDA graphs need a CUDA device; this run is on cpu");
  CHECK(e.name() == "compile (cuda graphs declined: eager)");
  CountingProgram p;
  for (int i = 0; i < 3; ++i) e.step(p, {}, 0.1);
  CHECK(p.runs == 3);
  CHECK_FALSE(p.device_lr_used);
}

// The [compile] binder takes a user's file: every mutation of a valid table either binds or is refused with a
// ConfigError (or toml++'s parse error) — never another exception. (tests/fuzz holds no plugin source, so the
// plugin's binder is exercised here, deterministically, instead of by a libFuzzer target.)
TEST_CASE("compile: mutated [compile] tables bind or are refused with a located error") {
  const std::string seed =
      "[compile]\nenabled = true\ncuda_graphs = true\nstatic_shapes = true\nwarmup_steps = 3\nmax_graphs = 4\n"
      "autotune_gemm = false\ntf32 = true\ncache_dir = \"c\"\n[compile.arch.sm_90]\nautotune_gemm = true\n";
  const std::string alphabet = "[]=.\"\n 0123456789_abcdefghijklmnopqrstuvwxyz{}#,-+tf";
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int bound = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = seed;
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const std::size_t at = next() % text.size();
      switch (next() % 3) {
        case 0: text[at] = alphabet[next() % alphabet.size()]; break;
        case 1: text.erase(at, 1 + next() % 8); break;
        default: text.insert(at, 1, alphabet[next() % alphabet.size()]); break;
      }
    }
    CAPTURE(text);
    try {
      bind_table(text);
      ++bound;
    } catch (const ax::ConfigError&) {
      ++refused;
    } catch (const toml::parse_error&) {
      ++refused;
    } catch (const std::exception& ex) {
      FAIL("unexpected exception: " << ex.what());
    }
  }
  CHECK(bound > 0);
  CHECK(refused > 0);
}
