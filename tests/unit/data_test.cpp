// Datasets: the built-in types, bad rows (error with file:line, or skipped and counted), the prepared-data
// cache (reused, rebuilt when the entry, the file or the tokenizer changes), the seeded split, and packing
// (positions restart, spans never mix, a packed sample's loss equals its loss alone); rows with no token to
// train on and token ids beyond the model's vocabulary are found at preparation, naming file:line.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/registry.hpp"
#include "data/data_config.hpp"
#include "data/packing.hpp"
#include "data/prepare.hpp"
#include "data/register.hpp"
#include "unit/test_paths.hpp"
#include "unit/train_fakes.hpp"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

std::string prepare_error(const ax::RunConfig& cfg, const ax::Tokenizer& tok) {
  ax::Registry reg;
  ax::data::register_builtin_datasets(reg);
  try {
    ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tok);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

ax::data::PreparedData prepare(const ax::RunConfig& cfg, const ax::Tokenizer& tok) {
  ax::Registry reg;
  ax::data::register_builtin_datasets(reg);
  return ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tok);
}

}  // namespace

TEST_CASE("completion dataset: prompt masked, eos appended, bad rows name file:line or are skipped") {
  auto dir = ax::test::scratch_dir("data_completion");
  write(dir / "a.jsonl", "{\"q\": \"1+1=\", \"a\": \"2\"}\n\n{\"q\": \"2+2=\", \"a\": \"4\"}\n{\"q\": 3, \"a\": \"x\"}\n");
  write(dir / "run.toml", "[data]\ncache_dir = \"cache\"\n[[datasets]]\ntype = \"completion\"\npath = \"a.jsonl\"\n"
                          "prompt_field = \"q\"\ntext_field = \"a\"\n");
  ax::test::ByteTokenizer tok;
  auto cfg = ax::load_config((dir / "run.toml").string());
  std::string err = prepare_error(cfg, tok);
  CHECK(err.find("a.jsonl:4: field 'q' must be a string") != std::string::npos);

  write(dir / "skip.toml", "[data]\ncache_dir = \"cache\"\n[[datasets]]\ntype = \"completion\"\npath = \"a.jsonl\"\n"
                           "prompt_field = \"q\"\ntext_field = \"a\"\non_bad_row = \"skip\"\n");
  auto d = prepare(ax::load_config((dir / "skip.toml").string()), tok);
  REQUIRE(d.train.size() == 2);
  CHECK(d.sources[0].skipped == 1);
  const auto& s = d.train[0];
  CHECK(s.input_ids == std::vector<int32_t>{'1', '+', '1', '=', '2', 256});
  CHECK(s.labels == std::vector<int32_t>{-100, -100, -100, -100, '2', 256});
  ax::test::remove_tree(dir);
}

TEST_CASE("config: unknown keys in [[datasets]] and [data] are errors with location") {
  auto dir = ax::test::scratch_dir("data_cfg");
  write(dir / "run.toml", "[[datasets]]\ntype = \"completion\"\npath = \"a.jsonl\"\ntext_feild = \"t\"\n");
  std::string err;
  try {
    ax::load_config((dir / "run.toml").string());
  } catch (const ax::ConfigError& e) {
    err = e.what();
  }
  CHECK(err.find("run.toml:4") != std::string::npos);
  CHECK(err.find("did you mean 'datasets.text_field'") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("pretokenized dataset: ids validated against the vocabulary, lengths must agree, padding dropped") {
  auto dir = ax::test::scratch_dir("data_pretok");
  write(dir / "ok.jsonl", "{\"input_ids\": [1, 2, 3, 257], \"labels\": [-100, 2, 3, -100], \"attention_mask\": [1, 1, 1, 0]}\n");
  write(dir / "vocab.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 999]}\n");
  write(dir / "len.jsonl", "{\"input_ids\": [1, 2], \"labels\": [1]}\n");
  ax::test::ByteTokenizer tok;
  auto cfg_for = [&](const std::string& file) {
    write(dir / "run.toml", "[data]\ncache = false\n[[datasets]]\ntype = \"pretokenized\"\npath = \"" + file + "\"\n");
    return ax::load_config((dir / "run.toml").string());
  };
  auto d = prepare(cfg_for("ok.jsonl"), tok);
  REQUIRE(d.train.size() == 1);
  CHECK(d.train[0].input_ids == std::vector<int32_t>{1, 2, 3});
  CHECK(d.train[0].labels == std::vector<int32_t>{-100, 2, 3});
  std::string e1 = prepare_error(cfg_for("vocab.jsonl"), tok);
  CHECK(e1.find("vocab.jsonl:2: 'input_ids'[1] = 999 is outside the vocabulary") != std::string::npos);
  std::string e2 = prepare_error(cfg_for("len.jsonl"), tok);
  CHECK(e2.find("len.jsonl:1: 'labels' has 1 entries but 'input_ids' has 2") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("prepared-data cache: reused, rebuilt when the data file or the tokenizer changes") {
  auto dir = ax::test::scratch_dir("data_cache");
  write(dir / "t.jsonl", "{\"text\": \"hello\"}\n{\"text\": \"world\"}\n");
  write(dir / "run.toml", "[data]\ncache_dir = \"cache\"\n[[datasets]]\ntype = \"completion\"\npath = \"t.jsonl\"\n");
  auto cfg = ax::load_config((dir / "run.toml").string());
  ax::test::ByteTokenizer tok("fp-1"), tok2("fp-2");
  auto a = prepare(cfg, tok);
  CHECK_FALSE(a.sources[0].from_cache);
  auto b = prepare(cfg, tok);
  CHECK(b.sources[0].from_cache);
  CHECK(b.train[1].input_ids == a.train[1].input_ids);
  CHECK_FALSE(prepare(cfg, tok2).sources[0].from_cache);  // other tokenizer
  CHECK(prepare(cfg, tok2).sources[0].from_cache);
  write(dir / "t.jsonl", "{\"text\": \"hello\"}\n{\"text\": \"there\"}\n{\"text\": \"!\"}\n");
  fs::last_write_time(dir / "t.jsonl", fs::last_write_time(dir / "t.jsonl") + std::chrono::seconds(5));
  auto c = prepare(cfg, tok);
  CHECK_FALSE(c.sources[0].from_cache);  // data file changed
  CHECK(c.train.size() == 3);
  ax::test::remove_tree(dir);
}

TEST_CASE("eval split: seeded fraction, or a separate file") {
  auto dir = ax::test::scratch_dir("data_split");
  std::string rows;
  for (int i = 0; i < 100; ++i) rows += "{\"text\": \"row " + std::to_string(i) + "\"}\n";
  write(dir / "t.jsonl", rows);
  write(dir / "e.jsonl", "{\"text\": \"eval\"}\n");
  write(dir / "frac.toml", "[data]\ncache = false\neval_fraction = 0.1\n[[datasets]]\ntype = \"completion\"\npath = \"t.jsonl\"\n");
  write(dir / "file.toml", "[data]\ncache = false\n[[datasets]]\ntype = \"completion\"\npath = \"t.jsonl\"\neval_path = \"e.jsonl\"\n");
  ax::test::ByteTokenizer tok;
  auto a = prepare(ax::load_config((dir / "frac.toml").string()), tok);
  auto b = prepare(ax::load_config((dir / "frac.toml").string()), tok);
  CHECK(a.train.size() == 90);
  CHECK(a.eval.size() == 10);
  for (std::size_t i = 0; i < a.eval.size(); ++i) CHECK(a.eval[i].input_ids == b.eval[i].input_ids);
  auto c = prepare(ax::load_config((dir / "frac.toml").string(), {"run.seed=5"}), tok);
  bool differs = false;
  for (std::size_t i = 0; i < a.eval.size(); ++i) differs |= a.eval[i].input_ids != c.eval[i].input_ids;
  CHECK(differs);
  auto f = prepare(ax::load_config((dir / "file.toml").string()), tok);
  CHECK(f.train.size() == 100);
  REQUIRE(f.eval.size() == 1);
  ax::test::remove_tree(dir);
}

TEST_CASE("packing: positions restart, spans per sample, first label masked") {
  std::vector<ax::Sample> s{{{1, 2, 3}, {1, 2, 3}}, {{4, 5}, {4, 5}}, {{6, 7, 8, 9}, {6, 7, 8, 9}}};
  auto packed = ax::data::pack_samples(s, {0, 1, 2}, 6);
  REQUIRE(packed.rows.size() == 2);
  CHECK(packed.rows[0] == std::vector<uint32_t>{0, 1});
  auto b = ax::data::make_batch(s, packed, {0, 1}, 6, 0);
  auto ids = b.input_ids.flatten(), pos = b.position_ids.flatten(), lab = b.labels.flatten();
  std::vector<int64_t> want_ids{1, 2, 3, 4, 5, 0, 6, 7, 8, 9, 0, 0}, want_pos{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 1},
      want_lab{-100, 2, 3, -100, 5, -100, -100, 7, 8, 9, -100, -100};
  for (int i = 0; i < 12; ++i) {
    CHECK(ids[i].item<int64_t>() == want_ids[i]);
    CHECK(pos[i].item<int64_t>() == want_pos[i]);
    CHECK(lab[i].item<int64_t>() == want_lab[i]);
  }
  std::vector<int32_t> cu(b.cu_seqlens.data_ptr<int32_t>(), b.cu_seqlens.data_ptr<int32_t>() + b.cu_seqlens.numel());
  CHECK(cu == std::vector<int32_t>{0, 3, 5, 6, 10, 12});
  CHECK(b.max_seqlen == 4);
}

TEST_CASE("packing: a packed batch gives every sample the loss it has alone") {
  ax::test::TinyLM model;
  std::vector<ax::Sample> s;
  for (int n : {5, 9, 3, 7, 6}) {
    ax::Sample x;
    for (int k = 0; k < n; ++k) x.input_ids.push_back(10 + (n * 7 + k * 13) % 200);
    x.labels = x.input_ids;
    x.labels[0] = -100;
    if (n == 9) x.labels[1] = x.labels[2] = -100;  // a prompt
    s.push_back(x);
  }
  std::vector<uint32_t> order{0, 1, 2, 3, 4};
  auto packed = ax::data::pack_samples(s, order, 16);
  REQUIRE(packed.rows.size() == 2);  // [5, 9] [3, 7, 6]
  std::vector<uint32_t> all_rows{0, 1};
  auto b = ax::data::make_batch(s, packed, all_rows, 16, 257);
  at::NoGradGuard ng;
  at::Tensor logits = model.forward(b, true).logits;  // [2, 16, V]
  at::Tensor logp = at::log_softmax(logits, -1);
  for (std::size_t r = 0; r < packed.rows.size(); ++r) {
    int64_t off = 0;
    for (uint32_t i : packed.rows[r]) {
      const auto& smp = s[i];
      const int64_t n = static_cast<int64_t>(smp.input_ids.size());
      double sum = 0;
      int cnt = 0;
      for (int64_t t = 0; t + 1 < n; ++t)
        if (smp.labels[t + 1] != -100) sum -= logp[r][off + t][smp.labels[t + 1]].item<double>(), ++cnt;
      ax::data::PackedRows alone{{{i}}, 0, 0};
      auto single = ax::data::make_batch(s, alone, {0}, n, 257);
      double want = model.forward(single, false).loss.item<double>();
      CHECK(sum / cnt == doctest::Approx(want).epsilon(1e-5));
      off += n;
    }
  }
}

TEST_CASE("data: a sample with no token to train on names its file:line or is dropped and counted") {
  // Row 2's prompt fills data.sequence_len = 8 (nothing after it is ever predicted); row 3 of the pretokenized
  // file has every label at -100 but the first, which packing never predicts either. Left in, a micro-batch of
  // such rows is a mean over no tokens: a NaN loss that stopped the run.
  auto dir = ax::test::scratch_dir("data_no_loss");
  write(dir / "c.jsonl", "{\"q\": \"1+1=\", \"a\": \"2\"}\n{\"q\": \"a prompt longer than eight\", \"a\": \"x\"}\n{\"q\": \"3=\", \"a\": \"3\"}\n");
  write(dir / "p.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n\n{\"input_ids\": [1, 2, 3], \"labels\": [1, -100, -100]}\n");
  ax::test::ByteTokenizer tok;
  auto cfg_for = [&](const std::string& type, const std::string& file, const std::string& policy) {
    std::string extra = type == "completion" ? "prompt_field = \"q\"\ntext_field = \"a\"\n" : "";
    write(dir / "run.toml", "[data]\nsequence_len = 8\ncache_dir = \"cache\"\n[[datasets]]\ntype = \"" + type + "\"\npath = \"" + file +
                                "\"\non_bad_row = \"" + policy + "\"\n" + extra);
    return ax::load_config((dir / "run.toml").string());
  };
  for (int pass = 0; pass < 2; ++pass) {  // the second pass reads the prepared-data cache: lines survive it
    CAPTURE(pass);
    std::string e1 = prepare_error(cfg_for("completion", "c.jsonl", "error"), tok);
    CHECK(e1.find("c.jsonl:2: no token to train on within data.sequence_len = 8") != std::string::npos);
    CHECK(e1.find("on_bad_row = \"skip\"") != std::string::npos);
    std::string e2 = prepare_error(cfg_for("pretokenized", "p.jsonl", "error"), tok);
    CHECK(e2.find("p.jsonl:3: no token to train on") != std::string::npos);
  }
  auto d = prepare(cfg_for("completion", "c.jsonl", "skip"), tok);
  REQUIRE(d.train.size() == 2);
  CHECK(d.sources[0].no_loss == 1);
  CHECK(d.sources[0].skipped == 0);
  CHECK(ax::data::describe(d).find("1 rows without a token to train on within sequence_len dropped") != std::string::npos);
  // With room for the answer the same row is kept (sequence_len is not part of the cache key).
  auto wide = prepare(ax::load_config((dir / "run.toml").string(), {"data.sequence_len=64"}), tok);
  CHECK(wide.sources[0].from_cache);
  CHECK(wide.train.size() == 3);
  CHECK(wide.sources[0].no_loss == 0);
  write(dir / "none.jsonl", "{\"input_ids\": [1, 2], \"labels\": [-100, -100]}\n");
  CHECK(prepare_error(cfg_for("pretokenized", "none.jsonl", "skip"), tok).find("none.jsonl: no row has a token to train on") !=
        std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("data: a token id beyond the model's vocabulary names the dataset file and row") {
  // The tokenizer knows 258 ids, the model (config.json vocab_size) only 100: found when preparing, not in
  // the forward pass, and also when the samples come from the prepared-data cache.
  auto dir = ax::test::scratch_dir("data_model_vocab");
  write(dir / "ids.jsonl", "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4, 200, 5]}\n");
  write(dir / "run.toml", "[data]\ncache_dir = \"cache\"\n[[datasets]]\ntype = \"pretokenized\"\npath = \"ids.jsonl\"\n");
  auto cfg = ax::load_config((dir / "run.toml").string());
  ax::test::ByteTokenizer tok;
  ax::Registry reg;
  ax::data::register_builtin_datasets(reg);
  for (int pass = 0; pass < 2; ++pass) {
    CAPTURE(pass);
    std::string err;
    try {
      ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tok, 100);
    } catch (const ax::UsageError& e) {
      err = e.what();
    }
    CHECK(err.find("ids.jsonl:2: token 1 = 200 is beyond the model's vocabulary (config.json vocab_size 100") != std::string::npos);
  }
  CHECK(ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tok, 258).train.size() == 2);
  ax::test::remove_tree(dir);
}
