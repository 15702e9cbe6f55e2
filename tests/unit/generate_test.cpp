// KV-cached decode and generation: the cached logits equal the full forward's at every step (prefill, one
// token, several tokens appended, rows of different lengths), greedy tokens equal transformers' generate
// (goldens from scripts/goldens/make_generate_goldens.py over the model-parity dirs, with their adapters), and
// the sampler's options (temperature, top_p, top_k, seed).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/selection.hpp"
#include "train/generate.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

struct Loaded {
  std::unique_ptr<ax::Registry> registry;
  std::unique_ptr<ax::Model> model;
};

Loaded load_case(const std::string& name) {
  Loaded l;
  l.registry = std::make_unique<ax::Registry>();
  ax::register_builtins(*l.registry);
  ax::ModelLoadOptions o;
  o.dir = (fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name).string();
  o.kernels = std::make_shared<ax::KernelSet>(*l.registry, ax::KernelPreferences{}, ax::DeviceInfo{});
  o.adapter_dir = o.dir + "/adapter";
  l.model = ax::load_model(*l.registry, o);
  l.model->set_training(false);
  return l;
}

// Last-position logits of the full forward over `seq` (fp32 [V]).
at::Tensor full_last(ax::Model& m, const std::vector<int64_t>& seq) {
  at::NoGradGuard g;
  ax::Batch b;
  b.input_ids = at::tensor(seq, at::kLong).view({1, -1});
  return m.forward(b, true).logits[0][-1].to(at::kFloat);
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

nlohmann::json golden(const std::string& name) {
  std::ifstream in(fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name / "generate_golden.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

std::vector<std::vector<int32_t>> golden_prompts(const nlohmann::json& g) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : g["prompts"]) out.push_back(p.get<std::vector<int32_t>>());
  return out;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<ax::train::Generation>& gens) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& g : gens) out.push_back(g.tokens);
  return out;
}

const char* kCases[] = {"llama",     "qwen2",          "mistral", "qwen3",  "qwen3_yarn", "llama_dynamic",
                        "qwen3_moe", "qwen3_moe_top1", "mixtral", "gemma3", "olmoe", "gpt_oss", "gpt_oss_mxfp4",
                        "qwen3_5", "qwen3_5_moe", "qwen3_next",
                        "glm4_moe", "glm4_moe_qknorm", "deepseek_v3", "deepseek_v3_qproj"};

}  // namespace

TEST_CASE("decode: cached logits equal the full forward's at every step") {
  // Not llama_dynamic: its frequencies follow the forward's length, so cached keys (rotated when they were
  // new) differ from a full forward's by design, in transformers too; its tokens are checked against HF below.
  for (const std::string name : {"llama", "qwen2", "mistral", "qwen3", "qwen3_yarn", "qwen3_moe", "qwen3_moe_top1",
                                    "mixtral", "gemma3", "olmoe", "gpt_oss", "gpt_oss_mxfp4", "glm4_moe", "deepseek_v3",
                                    "deepseek_v3_qproj"}) {
    CAPTURE(name);
    auto l = load_case(name);
    auto& dec = ax::train::decoder_of(*l.model);
    // Three rows: a prefill of 6, of 1, and of 3 then 4 more in one call (a turn appended to a conversation);
    // then one token per row per step, past the sliding windows (3, 4).
    std::vector<std::vector<int64_t>> seq{{3, 9, 1, 4, 7, 2}, {5}, {8, 0, 6}};
    auto cache = dec.new_cache(3, 20);
    at::Tensor logits = dec.decode(seq, *cache);
    for (int r = 0; r < 3; ++r) CHECK(rel(logits[r], full_last(*l.model, seq[r])) <= 1e-5);
    std::vector<int64_t> more{2, 2, 7, 1};
    logits = dec.decode({{}, {}, more}, *cache);
    seq[2].insert(seq[2].end(), more.begin(), more.end());
    CHECK(logits[0].abs().max().item<double>() == 0);  // a row given nothing
    CHECK(rel(logits[2], full_last(*l.model, seq[2])) <= 1e-5);
    CHECK(cache->length(2) == 7);
    for (int step = 0; step < 8; ++step) {
      std::vector<std::vector<int64_t>> next(3);
      for (int r = 0; r < 3; ++r) {
        next[r] = {(seq[r].back() * 7 + step) % 30};
        seq[r].push_back(next[r][0]);
      }
      logits = dec.decode(next, *cache);
      for (int r = 0; r < 3; ++r) {
        CAPTURE(step);
        CAPTURE(r);
        CHECK(rel(logits[r], full_last(*l.model, seq[r])) <= 1e-5);
      }
    }
    // Truncating a row and feeding other tokens is the forward of the new sequence.
    cache->truncate(1, 2);
    seq[1].resize(2);
    seq[1].push_back(11);
    logits = dec.decode({{}, {11}, {}}, *cache);
    CHECK(rel(logits[1], full_last(*l.model, seq[1])) <= 1e-5);
  }
}

namespace {
void check_linear_decode(const std::string& name) {
  CAPTURE(name);
  auto l = load_case(name);
  auto& dec = ax::train::decoder_of(*l.model);
  // A prefill of 6, of 1, and of 3 then 4 more in one call, then one token per row per step: every step is the
  // full forward over the row's whole sequence (the state carries it; the conv window spans 2 earlier tokens).
  std::vector<std::vector<int64_t>> seq{{3, 9, 1, 4, 7, 2}, {5}, {8, 0, 6}};
  auto cache = dec.new_cache(3, 40);
  at::Tensor logits = dec.decode(seq, *cache);
  for (int r = 0; r < 3; ++r) CHECK(rel(logits[r], full_last(*l.model, seq[r])) <= 1e-5);
  std::vector<int64_t> more{2, 2, 7, 1};
  logits = dec.decode({{}, {}, more}, *cache);
  seq[2].insert(seq[2].end(), more.begin(), more.end());
  CHECK(rel(logits[2], full_last(*l.model, seq[2])) <= 1e-5);
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int64_t>> next(3);
    for (int r = 0; r < 3; ++r) {
      next[r] = {(seq[r].back() * 7 + step) % 30};
      seq[r].push_back(next[r][0]);
    }
    logits = dec.decode(next, *cache);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(step);
      CAPTURE(r);
      CHECK(rel(logits[r], full_last(*l.model, seq[r])) <= 1e-5);
    }
  }
  // The state cannot go back to a shorter row; emptied, the row starts over from a zero state.
  CHECK_THROWS_WITH_AS(cache->truncate(1, 2), doctest::Contains("can only be emptied (truncate to 0)"), ax::UsageError);
  cache->truncate(1, cache->length(1));  // no change: allowed
  cache->truncate(1, 0);
  logits = dec.decode({{}, {11, 4}, {}}, *cache);
  CHECK(rel(logits[1], full_last(*l.model, {11, 4})) <= 1e-5);
}
}  // namespace

TEST_CASE("decode: linear-attention layers (qwen3_5, qwen3_next's fused projections) continue from their cached conv window and recurrent state") {
  check_linear_decode("qwen3_5");
  check_linear_decode("qwen3_next");
}

TEST_CASE("decode: refuses what it cannot hold") {
  auto l = load_case("qwen3");
  auto& dec = ax::train::decoder_of(*l.model);
  auto cache = dec.new_cache(2, 4);
  CHECK_THROWS_AS(dec.decode({{1, 2, 3, 4, 5}, {}}, *cache), ax::UsageError);  // over capacity
  CHECK_THROWS_AS(dec.decode({{1}}, *cache), ax::UsageError);                  // rows != batch
  CHECK_THROWS_AS(dec.decode({{1000}, {}}, *cache), ax::UsageError);           // id out of range
  CHECK_THROWS_AS(cache->truncate(0, 1), ax::UsageError);                      // longer than the row
  auto other = load_case("qwen3");
  auto foreign = ax::train::decoder_of(*other.model).new_cache(2, 4);
  CHECK_THROWS_AS(dec.decode({{1}, {}}, *foreign), ax::UsageError);
}

TEST_CASE("generate: greedy tokens equal transformers' generate") {
  for (const std::string name : kCases) {
    CAPTURE(name);
    auto l = load_case(name);
    auto g = golden(name);
    ax::train::GenerateOptions o;
    o.max_new_tokens = g["max_new_tokens"].get<int64_t>();
    const auto want = g["tokens"].get<std::vector<std::vector<int32_t>>>();
    for (int64_t batch : {1, 8}) {  // each prompt alone, and all three in one cache
      CAPTURE(batch);
      o.batch_size = batch;
      auto gens = ax::train::generate(ax::train::decoder_of(*l.model), golden_prompts(g), o);
      CHECK(tokens_of(gens) == want);
      for (const auto& x : gens) CHECK(x.finish_reason == "length");
    }
  }
}

TEST_CASE("generate: eos ends a sequence, and max_new per prompt") {
  auto l = load_case("qwen2");
  auto g = golden("qwen2");
  const auto want = g["tokens"].get<std::vector<std::vector<int32_t>>>();
  // The eos: the first token of prompt 1's answer after its first that has not appeared before it.
  std::size_t k = 1;
  while (std::find(want[1].begin(), want[1].begin() + k, want[1][k]) != want[1].begin() + k) ++k;
  REQUIRE(k < want[1].size());
  const int32_t eos = want[1][k];
  ax::train::GenerateOptions o;
  o.max_new_tokens = 10;
  o.eos_ids = {999, eos};
  auto gens = ax::train::generate(ax::train::decoder_of(*l.model), golden_prompts(g), o, {}, {10, 10, 4});
  CHECK(gens[1].tokens == std::vector<int32_t>(want[1].begin(), want[1].begin() + k + 1));
  CHECK(gens[1].finish_reason == "eos");
  CHECK(gens[2].tokens.size() <= 4);
  // The exact_match entry point keeps the eos as the last token, as before.
  auto em = ax::train::generate_greedy(*l.model, golden_prompts(g), {10, 10, 10}, eos);
  CHECK(em[1] == gens[1].tokens);
}

TEST_CASE("generate: stop strings cut the text, streaming gives the same text") {
  auto l = load_case("llama");
  auto g = golden("llama");
  const auto want = g["tokens"].get<std::vector<std::vector<int32_t>>>();
  ax::train::GenerateOptions o;
  o.max_new_tokens = 10;
  // A detokenizer of this tokenizer-less model: each id as "<id>".
  o.detokenize = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (auto i : ids) s += "<" + std::to_string(i) + ">";
    return s;
  };
  const std::string full = o.detokenize(want[2]);
  const std::string stop = "<" + std::to_string(want[2][3]) + ">";  // a token of the answer
  const std::size_t at = full.find(stop);
  o.stop = {stop, "never"};
  std::vector<std::string> streamed(3);
  auto gens = ax::train::generate(ax::train::decoder_of(*l.model), golden_prompts(g), o,
                                  [&](std::size_t i, const std::string& piece) { streamed[i] += piece; });
  CHECK(gens[2].text == full.substr(0, at));
  CHECK(gens[2].finish_reason == "stop");
  for (int i = 0; i < 3; ++i) CHECK(streamed[i] == gens[i].text);
  CHECK_THROWS_AS(ax::train::generate(ax::train::decoder_of(*l.model), golden_prompts(g), [&] {
    auto bad = o;
    bad.stop = {""};
    return bad;
  }()), ax::UsageError);
}

TEST_CASE("generate: sampling options") {
  auto l = load_case("mixtral");
  auto g = golden("mixtral");
  const auto want = g["tokens"].get<std::vector<std::vector<int32_t>>>();
  auto& dec = ax::train::decoder_of(*l.model);
  auto run = [&](double t, double p, int64_t k, uint64_t seed) {
    ax::train::GenerateOptions o;
    o.max_new_tokens = 10;
    o.sampling = {t, p, k, seed};
    return tokens_of(ax::train::generate(dec, golden_prompts(g), o));
  };
  CHECK(run(1e-6, 1.0, 0, 3) == want);  // temperature -> 0 is greedy
  CHECK(run(1.0, 1e-9, 0, 3) == want);  // a tiny top_p keeps the likeliest token only
  CHECK(run(1.0, 1.0, 1, 3) == want);   // top_k = 1 likewise
  auto a = run(1.5, 1.0, 0, 42);
  CHECK(a == run(1.5, 1.0, 0, 42));     // a seed reproduces
  CHECK(a != run(1.5, 1.0, 0, 43));
  CHECK(a != want);
}

TEST_CASE("sampling: frequencies follow the tempered distribution") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor logits = at::tensor({0.0f, std::log(3.0f), -1e9f});
  ax::train::SamplingOptions o{1.0, 1.0, 0, 0};
  int ones = 0, n = 4000;
  for (int i = 0; i < n; ++i) ones += ax::train::sample_token(logits, o, gen) == 1;
  CHECK(std::abs(ones / double(n) - 0.75) < 0.03);
  o.temperature = 2.0;  // p1 = sqrt(3) / (1 + sqrt(3))
  ones = 0;
  for (int i = 0; i < n; ++i) ones += ax::train::sample_token(logits, o, gen) == 1;
  CHECK(std::abs(ones / double(n) - std::sqrt(3.0) / (1 + std::sqrt(3.0))) < 0.03);
  o.temperature = 1.0;
  o.top_p = 0.7;  // 0.75 alone reaches 0.7: token 1 only
  for (int i = 0; i < 50; ++i) CHECK(ax::train::sample_token(logits, o, gen) == 1);
  CHECK_THROWS_AS(ax::train::check_sampling({-1.0, 1.0, 0, 0}), ax::UsageError);
  CHECK_THROWS_AS(ax::train::check_sampling({1.0, 0.0, 0, 0}), ax::UsageError);
  CHECK_THROWS_AS(ax::train::check_sampling({1.0, 1.0, -2, 0}), ax::UsageError);
}
