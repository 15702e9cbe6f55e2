// Pre-quantised checkpoints: Hugging Face models saved by transformers + bitsandbytes in 4-bit nf4 form load packed
// as stored (docs/weights.md), compute what transformers computes from them, and every malformed field is refused
// naming the file and the tensor. Goldens: tests/data/bnb/ (scripts/goldens/make_bnb_checkpoint_goldens.py).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/bnb_load.hpp"
#include "models/training_record.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

fs::path case_dir(const std::string& name) { return fs::path(AXENGINE_TEST_DATA_DIR) / "bnb" / name; }

struct Env {
  ax::Registry reg;
  Env() { ax::register_builtins(reg); }
  std::unique_ptr<ax::Model> load(const fs::path& dir, const ax::WeightPolicy& weights = {}, const std::string& adapter = "") {
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    o.weights = weights;
    o.adapter_dir = adapter;
    return ax::load_model(reg, o);
  }
};

ax::WeightPolicy policy(const std::string& format, int64_t blocksize = 64, bool double_quant = false) {
  ax::WeightPolicy p;
  p.format = format;
  p.blocksize = blocksize;
  p.double_quant = double_quant;
  return p;
}

std::map<std::string, at::Tensor> read_all(const fs::path& file) {
  auto ck = ax::safetensors::Checkpoint::open_file(file.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& n : ck.names()) out[n] = ck.get(n);
  return out;
}

at::Tensor logits_of(ax::Model& m, const at::Tensor& ids) {
  ax::Batch b;
  b.input_ids = ids;
  b.labels = ids.clone();
  return m.forward(b, true).logits;
}

// A copy of case `name` whose tensors and config.json went through `edit` (to make one malformed input).
using Tensors = std::map<std::string, at::Tensor>;
fs::path edited(const std::string& name, const std::string& tag, const std::function<void(Tensors&)>& tensors,
                const std::function<void(nlohmann::json&)>& config = {}) {
  const fs::path dir = ax::test::scratch_dir("bnb_" + tag);
  fs::copy(case_dir(name), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  Tensors ts = read_all(dir / "model.safetensors");
  if (tensors) tensors(ts);
  ax::safetensors::save((dir / "model.safetensors").string(), std::vector<std::pair<std::string, at::Tensor>>(ts.begin(), ts.end()));
  if (config) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    config(j);
    std::ofstream(dir / "config.json") << j.dump(1);
  }
  return dir;
}

at::Tensor json_bytes(const std::string& text) {
  return at::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, at::kByte).clone();
}

const std::string kQ = "model.layers.0.self_attn.q_proj.weight";

}  // namespace

TEST_CASE("bnb checkpoint: both goldens load packed as stored and give transformers' logits") {
  Env env;
  for (const std::string name : {"qwen3_nf4_dq", "qwen3_nf4"}) {
    CAPTURE(name);
    const bool dq = name == "qwen3_nf4_dq";
    const auto golden = read_all(case_dir(name) / "golden.safetensors");
    auto m = env.load(case_dir(name));  // weight_format unset ("dense"): as stored
    const ax::WeightStats s = m->weight_stats();
    CHECK(s.format == "nf4");
    // 2 layers of q, o [96, 96], k, v [48, 96], gate, up, down [192, 96]; qwen3_nf4 keeps layer 1's down_proj dense.
    const int64_t per_layer = 2 * 96 * 96 + 2 * 48 * 96 + 3 * 192 * 96;
    CHECK(s.packed_params == (dq ? 2 * per_layer : 2 * per_layer - 192 * 96));
    const double bpp = double(s.packed_bytes) / double(s.packed_params);
    MESSAGE(name << ": " << bpp << " bytes/param packed; resident " << s.bytes << " bytes");
    if (dq) {
      CHECK(bpp < 0.5 + 4.0 / 64);
      CHECK(bpp > 0.5 + 1.0 / 64);
      CHECK(s.kept.empty());
    } else {
      CHECK(bpp == doctest::Approx(0.5 + 4.0 / 64));
      REQUIRE(s.kept.size() == 1);
      CHECK(s.kept[0].find("model.layers.1.mlp.down_proj (stored unpacked") == 0);
    }
    // The packed fields are the checkpoint's bytes, exposed as parameters.
    bool saw_codes = false;
    for (const auto& [n, t] : m->named_parameters())
      if (n == kQ) saw_codes = t.scalar_type() == at::kByte && t.numel() == 96 * 96 / 2;
    CHECK(saw_codes);
    const at::Tensor got = logits_of(*m, golden.at("input_ids"));
    const at::Tensor want = golden.at("logits");
    MESSAGE(name << ": max |logits - transformers| = " << (got - want).abs().max().item<double>());
    CHECK(at::allclose(got, want, 1e-4, 1e-5));
  }
}

TEST_CASE("bnb checkpoint: the packed weight dequantises to bitsandbytes' dequantize_4bit bit for bit") {
  const auto golden = read_all(case_dir("qwen3_nf4_dq") / "golden.safetensors");
  auto ckpt = ax::safetensors::Checkpoint::open_dir(case_dir("qwen3_nf4_dq").string());
  at::Tensor code;
  ax::ops::WeightTensor w = ax::models::read_bnb_nf4(ckpt, kQ, {96, 96}, code);
  CHECK(w.double_quant());
  CHECK(w.blocksize == 64);
  CHECK(w.nested_blocksize == 256);
  CHECK(at::equal(ax::ops::dequantize(w, at::kFloat), golden.at("deq." + kQ)));
  // down_proj has 288 absmax blocks: two nested blocks, the second partial.
  ax::ops::WeightTensor down = ax::models::read_bnb_nf4(ckpt, "model.layers.0.mlp.down_proj.weight", {96, 192}, code);
  CHECK(down.nested_scales.numel() == 2);
  CHECK(down.nested_code.data_ptr() == w.nested_code.data_ptr());  // one code for the whole checkpoint
}

TEST_CASE("bnb checkpoint: a peft adapter trained on the 4-bit base gives peft's logits") {
  Env env;
  for (const std::string name : {"qwen3_nf4_dq", "qwen3_nf4"}) {
    CAPTURE(name);
    const auto golden = read_all(case_dir(name) / "golden.safetensors");
    auto m = env.load(case_dir(name), {}, (case_dir(name) / "adapter").string());
    CHECK(at::allclose(logits_of(*m, golden.at("input_ids")), golden.at("logits_adapter"), 1e-4, 1e-5));
  }
}

TEST_CASE("bnb checkpoint: weight_format keys against a pre-quantised checkpoint") {
  Env env;
  const auto golden = read_all(case_dir("qwen3_nf4_dq") / "golden.safetensors");
  const at::Tensor ids = golden.at("input_ids");
  const at::Tensor base = logits_of(*env.load(case_dir("qwen3_nf4_dq")), ids);
  // nf4 with the checkpoint's parameters: the same model.
  CHECK(at::equal(logits_of(*env.load(case_dir("qwen3_nf4_dq"), policy("nf4", 64, true)), ids), base));
  CHECK_THROWS_WITH_AS(env.load(case_dir("qwen3_nf4_dq"), policy("nf4", 64, false)),
                       doctest::Contains("bnb_4bit_use_double_quant is true but the config has model.double_quant = false"),
                       ax::UsageError);
  CHECK_THROWS_WITH_AS(env.load(case_dir("qwen3_nf4"), policy("nf4", 128, false)),
                       doctest::Contains("is packed with blocksize 64 but the config asks for model.quant_blocksize = 128"),
                       ax::UsageError);
  CHECK_THROWS_WITH_AS(env.load(case_dir("qwen3_nf4"), policy("mxfp4")),
                       doctest::Contains("pre-quantised in nf4 (bitsandbytes); model.weight_format = \"mxfp4\" would quantise it a second time"),
                       ax::UsageError);
  // skip_modules dequantises the projections it names: the same values, held dense.
  ax::WeightPolicy p = policy("nf4", 64, true);
  p.skip_modules = {"o_proj"};
  auto skipped = env.load(case_dir("qwen3_nf4_dq"), p);
  const auto s = skipped->weight_stats();
  REQUIRE(s.kept.size() == 2);
  CHECK(s.kept[0] == "model.layers.0.self_attn.o_proj (skip_modules 'o_proj', dequantised)");
  CHECK(s.packed_params == 2 * (96 * 96 + 2 * 48 * 96 + 3 * 192 * 96));
  CHECK(at::allclose(logits_of(*skipped, ids), base, 1e-5, 1e-6));
}

TEST_CASE("bnb checkpoint: malformed packed tensors and quantization_config are refused naming file and tensor") {
  Env env;
  const std::string qs = kQ + ".quant_state.bitsandbytes__nf4";
  struct Bad {
    std::string tag, name, want;
    std::function<void(Tensors&)> tensors;
    std::function<void(nlohmann::json&)> config;
  };
  const std::vector<Bad> cases = {
      {"no_absmax", "qwen3_nf4", "tensor '" + kQ + ".absmax' is missing: the packed weight '" + kQ + "' needs it",
       [&](Tensors& t) { t.erase(kQ + ".absmax"); }, {}},
      {"absmax_size", "qwen3_nf4", "tensor '" + kQ + ".absmax' has shape [143] (143 elements) but its quant state implies 144",
       [&](Tensors& t) { t[kQ + ".absmax"] = t[kQ + ".absmax"].narrow(0, 0, 143).clone(); }, {}},
      {"absmax_dtype", "qwen3_nf4_dq", "tensor '" + kQ + ".absmax' has dtype F32, a bitsandbytes 4-bit absmax is U8",
       [&](Tensors& t) { t[kQ + ".absmax"] = t[kQ + ".absmax"].to(at::kFloat); }, {}},
      {"codes_size", "qwen3_nf4", "tensor '" + kQ + "' has shape [4607, 1] (4607 elements) but its quant state implies 4608",
       [&](Tensors& t) { t[kQ] = t[kQ].narrow(0, 0, 4607).clone(); }, {}},
      {"bad_json", "qwen3_nf4", "tensor '" + qs + "': the quant state is not valid JSON",
       [&](Tensors& t) { t[qs] = json_bytes("{\"quant_type\": \"nf4\", "); }, {}},
      {"fp4_state", "qwen3_nf4", "tensor '" + qs + "': quant state 'quant_type' 'fp4' is not supported (only nf4)",
       [&](Tensors& t) {
         t[qs] = json_bytes("{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [96, 96]}");
       }, {}},
      {"state_shape", "qwen3_nf4", "tensor '" + qs + "' gives the weight shape [96, 64] but the model config implies [96, 96]",
       [&](Tensors& t) {
         t[qs] = json_bytes("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [96, 64]}");
       }, {}},
      {"state_key", "qwen3_nf4", "quant state 'absmax_scale' is not a key of a bitsandbytes 4-bit quant state",
       [&](Tensors& t) {
         t[qs] = json_bytes("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [96, 96], \"absmax_scale\": 1}");
       }, {}},
      {"quant_map", "qwen3_nf4", "tensor '" + kQ + ".quant_map' is not the NF4 table",
       [&](Tensors& t) { t[kQ + ".quant_map"] = t[kQ + ".quant_map"] * 0.5; }, {}},
      {"nested_map", "qwen3_nf4_dq", ".nested_quant_map' is not bitsandbytes' signed 8-bit dynamic map",
       [&](Tensors& t) { t[kQ + ".nested_quant_map"] = t[kQ + ".nested_quant_map"] * 2; }, {}},
      {"no_nested", "qwen3_nf4_dq", "tensor '" + kQ + ".nested_absmax' is missing",
       [&](Tensors& t) { t.erase(kQ + ".nested_absmax"); }, {}},
      {"fp4_tensor", "qwen3_nf4", "the weight is packed in bitsandbytes fp4, which is not supported",
       [&](Tensors& t) {
         t[kQ + ".quant_state.bitsandbytes__fp4"] = t[qs];
         t.erase(qs);
       }, {}},
      {"cfg_fp4", "qwen3_nf4", "'quantization_config.bnb_4bit_quant_type' 'fp4' is not supported (only nf4)", {},
       [](nlohmann::json& j) { j["quantization_config"]["bnb_4bit_quant_type"] = "fp4"; }},
      {"cfg_gptq", "qwen3_nf4", "'quantization_config.quant_method' 'gptq' is not supported", {},
       [](nlohmann::json& j) { j["quantization_config"]["quant_method"] = "gptq"; }},
      {"cfg_8bit", "qwen3_nf4", "'quantization_config.load_in_8bit' true is not supported", {},
       [](nlohmann::json& j) { j["quantization_config"]["load_in_8bit"] = true; }},
      {"cfg_missing", "qwen3_nf4", "' is packed by bitsandbytes (it has a quant state) but ", {},
       [](nlohmann::json& j) { j.erase("quantization_config"); }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.tag);
    const fs::path dir = edited(c.name, c.tag, c.tensors, c.config);
    CHECK_THROWS_WITH_AS(env.load(dir), doctest::Contains(c.want.c_str()), ax::UsageError);
    // every message names the file it is about
    try {
      env.load(dir);
    } catch (const ax::UsageError& e) {
      CHECK(std::string(e.what()).find(dir.string()) != std::string::npos);
    }
    ax::test::remove_tree(dir);
  }
}

TEST_CASE("bnb checkpoint: inspect reports the packed format") {
  const std::string dq = ax::inspect_model_dir(case_dir("qwen3_nf4_dq").string());
  CHECK(dq.find("weights        nf4 (bitsandbytes, double quant, blocksize 64), pre-quantised: 14 of 15 projections packed") !=
        std::string::npos);
  CHECK(dq.find(kQ + "  U8 [4608, 1]  nf4 [96, 96]") != std::string::npos);
  CHECK(dq.find("(not used)") == std::string::npos);  // the quant-state fields belong to their weight
  const std::string plain = ax::inspect_model_dir(case_dir("qwen3_nf4").string());
  CHECK(plain.find("weights        nf4 (bitsandbytes, blocksize 64), pre-quantised: 13 of 15 projections packed") !=
        std::string::npos);
}

TEST_CASE("bnb checkpoint: merge-lora writes the dequantised base plus the adapter, dense") {
  Env env;
  const fs::path out = ax::test::scratch_dir("bnb_merge") / "merged";
  const fs::path src = case_dir("qwen3_nf4_dq");
  ax::merge_lora_dir(env.reg, src.string(), (src / "adapter").string(), out.string(), "", ax::WeightPolicy{});
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(out / "config.json"));
  CHECK_FALSE(cfg.contains("quantization_config"));  // a dense model: transformers must not read it as 4-bit
  const auto merged = read_all(out / "model.safetensors");
  for (const auto& [n, t] : merged) CHECK_MESSAGE((t.scalar_type() == at::kFloat), n);
  // q_proj: bitsandbytes' dequantisation plus scaling · B·A (alpha 5, r 2).
  const auto golden = read_all(src / "golden.safetensors");
  const auto adapter = read_all(src / "adapter" / "adapter_model.safetensors");
  const std::string lora = "base_model.model.model.layers.0.self_attn.q_proj.lora_";
  const at::Tensor want = golden.at("deq." + kQ) + 2.5 * at::matmul(adapter.at(lora + "B.weight"), adapter.at(lora + "A.weight"));
  CHECK(at::allclose(merged.at(kQ), want, 1e-6, 1e-7));
  // k_proj has no LoRA: exactly the dequantised base.
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  at::Tensor code;
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  CHECK(at::equal(merged.at(k), ax::ops::dequantize(ax::models::read_bnb_nf4(ckpt, k, {48, 96}, code), at::kFloat)));
  // And the merged dense model computes the adapter's logits.
  auto m = env.load(out);
  CHECK(m->weight_stats().format == "dense");
  CHECK(at::allclose(logits_of(*m, golden.at("input_ids")), golden.at("logits_adapter"), 1e-4, 1e-5));
  ax::test::remove_tree(out.parent_path());
}

namespace {

// `src`'s checkpoint in bitsandbytes 4-bit form, written as QuantState.as_dict(packed=True) lays it out, from
// ops::quantize_nf4 (bit-exact with bitsandbytes' quantize_4bit): every attention and expert projection packed.
// `twin` gets the dense model of the same values (each packed tensor dequantised).
void write_bnb_twins(const fs::path& src, const fs::path& packed, const fs::path& twin, bool double_quant) {
  for (const auto& d : {packed, twin}) {
    fs::create_directories(d);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      if (fs::exists(src / f)) fs::copy_file(src / f, d / f);
  }
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  std::ofstream(twin / "config.json") << cfg.dump(1);
  cfg["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"},
                                {"bnb_4bit_use_double_quant", double_quant}, {"bnb_4bit_compute_dtype", "float32"},
                                {"bnb_4bit_quant_storage", "uint8"}, {"llm_int8_skip_modules", nullptr}};
  std::ofstream(packed / "config.json") << cfg.dump(1);
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  std::vector<std::pair<std::string, at::Tensor>> p, t;
  const auto& v = ax::ops::nf4_values();
  const at::Tensor qmap = at::tensor(at::ArrayRef<float>(v.data(), v.size()), at::kFloat);
  for (const auto& n : ckpt.names()) {
    const at::Tensor w = ckpt.get(n);
    const bool linear = n.find("_proj.weight") != std::string::npos;
    if (!linear) {
      p.emplace_back(n, w);
      t.emplace_back(n, w);
      continue;
    }
    const ax::ops::WeightTensor q = ax::ops::quantize_nf4(w, 64, double_quant);
    t.emplace_back(n, ax::ops::dequantize(q, at::kFloat));
    p.emplace_back(n, q.codes.reshape({-1, 1}));
    p.emplace_back(n + ".absmax", q.scales);
    p.emplace_back(n + ".quant_map", qmap.clone());
    nlohmann::json st = {{"quant_type", "nf4"}, {"blocksize", 64}, {"dtype", "float32"}, {"shape", w.sizes().vec()}};
    if (double_quant) {
      p.emplace_back(n + ".nested_absmax", q.nested_scales);
      p.emplace_back(n + ".nested_quant_map", q.nested_code.clone());
      st.update({{"nested_blocksize", 256}, {"nested_dtype", "float32"}, {"nested_offset", q.nested_offset}});
    }
    p.emplace_back(n + ".quant_state.bitsandbytes__nf4", json_bytes(st.dump()));
  }
  ax::safetensors::save((packed / "model.safetensors").string(), p);
  ax::safetensors::save((twin / "model.safetensors").string(), t);
}

}  // namespace

TEST_CASE("bnb checkpoint: per-expert packed MoE weights load as one fused nf4 weight") {
  Env env;
  const fs::path dir = ax::test::scratch_dir("bnb_moe");
  ax::init_model_dir("tiny-qwen3-moe", (dir / "model").string(), 5);
  for (const bool dq : {false, true}) {
    CAPTURE(dq);
    const std::string tag = dq ? "dq" : "plain";
    write_bnb_twins(dir / "model", dir / ("packed_" + tag), dir / ("twin_" + tag), dq);
    auto packed = env.load(dir / ("packed_" + tag));
    auto twin = env.load(dir / ("twin_" + tag));
    const auto s = packed->weight_stats();
    CHECK(s.format == "nf4");
    // 2 layers: q, o [64, 64], k, v [32, 64], 6 experts of gate, up [32, 64] and down [64, 32].
    CHECK(s.packed_params == 2 * (2 * 64 * 64 + 2 * 32 * 64 + 6 * 3 * 32 * 64));
    const at::Tensor ids = at::arange(2 * 9, at::kLong).reshape({2, 9}).remainder(60);
    CHECK(at::allclose(logits_of(*packed, ids), logits_of(*twin, ids), 1e-5, 1e-6));
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("bnb checkpoint: a run's kernel plan asks for nf4 kernels and no quantizer") {
  const fs::path dir = ax::test::scratch_dir("bnb_plan");
  std::ofstream(dir / "run.toml") << "[model]\npath = \"" << case_dir("qwen3_nf4_dq").string() << "\"\n";
  ax::StartOptions o;
  o.config_file = (dir / "run.toml").string();
  o.discover = false;
  auto engine = ax::Engine::start(o);
  bool nf4_linear = false, quantizer = false;
  for (const auto& r : engine->resolve_all()) {
    nf4_linear = nf4_linear || (r.op == "linear.lora" && r.query.format == "nf4");
    quantizer = quantizer || r.op == "quantize";
  }
  CHECK(nf4_linear);
  CHECK_FALSE(quantizer);  // nothing is packed at load
  ax::test::remove_tree(dir);
}

TEST_CASE("bnb checkpoint: an adapter trained on a pre-quantised base merges onto it from its training record, "
          "and is refused on a dense base") {
  Env env;
  const fs::path dir = ax::test::scratch_dir("bnb_record_merge");
  const fs::path src = case_dir("qwen3_nf4_dq");
  fs::copy(src / "adapter", dir / "adapter", fs::copy_options::recursive);
  // What `run` records for this base: the weight keys unset (the checkpoint is packed as stored) and the base
  // held in nf4.
  ax::models::TrainingRecord rec;
  rec.base_model = src.string();
  rec.base_format = env.load(src)->weight_stats().format;
  REQUIRE(rec.base_format == "nf4");
  rec.dtype = "fp32";
  ax::models::write_training_record((dir / "adapter").string(), rec);
  ax::merge_lora_dir(env.reg, "", (dir / "adapter").string(), (dir / "merged").string(), "");
  const auto golden = read_all(src / "golden.safetensors");
  auto merged = env.load(dir / "merged");
  CHECK(merged->weight_stats().format == "dense");
  // peft's logits with the adapter on the 4-bit base (scripts/goldens/make_bnb_checkpoint_goldens.py)
  CHECK(at::allclose(logits_of(*merged, golden.at("input_ids")), golden.at("logits_adapter"), 1e-4, 1e-5));
  // A dense model of the same architecture (the merged one) is not the base the adapter learned on.
  CHECK_THROWS_WITH_AS(ax::merge_lora_dir(env.reg, (dir / "merged").string(), (dir / "adapter").string(),
                                          (dir / "again").string(), ""),
                       doctest::Contains("the adapter was trained on a base held in nf4"), ax::UsageError);
  CHECK_FALSE(fs::exists(dir / "again"));
  ax::test::remove_tree(dir);
}
