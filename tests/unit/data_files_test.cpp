// Data files as users have them (data/jsonl.hpp): JSON arrays, JSON Lines in ".json" files, Parquet written by
// pyarrow (sharded as HF `datasets` names its files), globs; errors naming file and row in every format; and the
// `alpaca` type, whose samples equal the Stanford Alpaca prompt + output tokenised by the `tokenizers` package.
// Fixtures and expected rows: tests/data/datasets/, written by scripts/goldens/make_data_fixtures.py.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/registry.hpp"
#include "data/data_config.hpp"
#include "data/jsonl.hpp"
#include "data/prepare.hpp"
#include "data/register.hpp"
#include "data/types.hpp"
#include "unit/test_paths.hpp"
#include "unit/train_fakes.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(AXENGINE_TEST_DATA_DIR) + "/datasets/";

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

const nlohmann::json& expected() {
  static const nlohmann::json e = [] {
    std::ifstream in(kFixtures + "expected.json");
    return nlohmann::json::parse(in);
  }();
  return e;
}

nlohmann::json rows_of(const std::string& path) {
  auto contents = ax::data::read_rows(path, ax::data::BadRowPolicy::error, [](const nlohmann::json&) { return ""; });
  nlohmann::json out = nlohmann::json::array();
  for (auto& r : contents.rows) out.push_back(r.value);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

ax::data::PreparedData prepare(const fs::path& config, const ax::Tokenizer& tok, int64_t model_vocab = 0) {
  ax::Registry reg;
  ax::data::register_builtin_datasets(reg);
  auto cfg = ax::load_config(config.string());
  return ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, tok, model_vocab);
}

}  // namespace

TEST_CASE("data files: JSON arrays and JSON Lines in .json files read as the rows python wrote") {
  CHECK(ax::data::detect_format(kFixtures + "alpaca_array.json") == ax::data::FileFormat::json_array);
  CHECK(ax::data::detect_format(kFixtures + "alpaca_lines.json") == ax::data::FileFormat::jsonl);
  CHECK(rows_of(kFixtures + "alpaca_array.json") == expected()["alpaca_array.json"]);
  CHECK(rows_of(kFixtures + "alpaca_lines.json") == expected()["alpaca_lines.json"]);
}

TEST_CASE("data files: a JSON array's bad element, syntax error and non-array are named") {
  auto dir = ax::test::scratch_dir("data_files_json");
  write(dir / "a.json", "[\n {\"text\": \"x\"},\n {\"text\": 5},\n 3\n]\n");
  auto check = [](const nlohmann::json& v) { return v["text"].is_string() ? "" : "field 'text' must be a string"; };
  auto err = error_of([&] { ax::data::read_rows((dir / "a.json").string(), ax::data::BadRowPolicy::error, check); });
  CHECK(err.find("a.json: element 1: field 'text' must be a string") != std::string::npos);
  auto skipped = ax::data::read_rows((dir / "a.json").string(), ax::data::BadRowPolicy::skip, check);
  CHECK(skipped.rows.size() == 1);
  CHECK(skipped.skipped == 2);  // element 2 is not an object
  write(dir / "b.json", "[\n {\"text\": \"x\"},\n {\"text\": \"y\",}\n]\n");
  err = error_of([&] { rows_of((dir / "b.json").string()); });
  CAPTURE(err);
  CHECK(err.find("b.json: not valid JSON at line 3, column 15") != std::string::npos);  // the stray }, as python's json says
  ax::test::remove_tree(dir);
}

TEST_CASE("data files: Parquet written by pyarrow reads as its rows (lists, structs, nulls, dictionaries)") {
  if (!ax::data::parquet_supported()) {
    CHECK(error_of([] { rows_of(kFixtures + "alpaca.parquet"); }).find("built without Parquet support") != std::string::npos);
    return;
  }
  for (const char* f : {"alpaca.parquet", "pretok.parquet", "chat.parquet"}) {
    CAPTURE(f);
    CHECK(ax::data::detect_format(kFixtures + f) == ax::data::FileFormat::parquet);
    CHECK(rows_of(kFixtures + f) == expected()[f]);
  }
  // A column of a type no dataset type reads is left out, and named when a row fails its type's check.
  CHECK(rows_of(kFixtures + "binary.parquet") == nlohmann::json::parse(R"([{"text": "a"}])"));
  CHECK(ax::data::read_parquet_rows(kFixtures + "binary.parquet").unread == std::vector<std::string>{"'blob' (binary)"});
  auto err = error_of([] {
    ax::data::read_rows(kFixtures + "binary.parquet", ax::data::BadRowPolicy::error,
                        [](const nlohmann::json& v) { return v.contains("blob") ? "" : "field 'blob' is missing"; });
  });
  CHECK(err.find("binary.parquet: row 0: field 'blob' is missing (this file's column(s) 'blob' (binary) are of Arrow types axengine does not read)") != std::string::npos);
  auto dir = ax::test::scratch_dir("data_files_parquet");
  write(dir / "torn.parquet", "PAR1 this is not a parquet file PAR1");
  CHECK(error_of([&] { rows_of((dir / "torn.parquet").string()); }).find("torn.parquet: not a readable Parquet file") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("data files: a glob reads every match in sorted order; no match is an error") {
  if (ax::data::parquet_supported()) {
    auto rows = rows_of(kFixtures + "sharded/train-*-of-00002.parquet");
    nlohmann::json want = expected()["sharded/train-00000-of-00002.parquet"];
    for (const auto& r : expected()["sharded/train-00001-of-00002.parquet"]) want.push_back(r);
    CHECK(rows == want);
  }
  auto dir = ax::test::scratch_dir("data_files_glob");
  fs::create_directories(dir / "d" / "sub.jsonl");  // a directory the pattern matches is not data
  write(dir / "d" / "b.jsonl", "{\"n\": 2}\n");
  write(dir / "d" / "a.jsonl", "{\"n\": 1}\n");
  write(dir / "d" / "c.json", "[{\"n\": 3}]");
  CHECK(rows_of((dir / "d" / "*.json*").string()) == nlohmann::json::parse(R"([{"n": 1}, {"n": 2}, {"n": 3}])"));
  auto err = error_of([&] {
    ax::data::read_rows((dir / "d" / "*.json*").string(), ax::data::BadRowPolicy::error,
                        [](const nlohmann::json& v) { return v["n"] == 3 ? "three" : ""; });
  });
  CHECK(err.find("c.json: element 0: three") != std::string::npos);
  err = error_of([&] { rows_of((dir / "d" / "*.parquet").string()); });
  CHECK(err.find("*.parquet: no file matches this pattern") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("alpaca: the Stanford Alpaca prompt, with and without input, braces in the text left alone") {
  CHECK(ax::data::alpaca_prompt("Add.", "1, 2") ==
        "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
        "response that appropriately completes the request.\n\n### Instruction:\nAdd.\n\n### Input:\n1, 2\n\n### Response:\n");
  CHECK(ax::data::alpaca_prompt("Say hi.", "") ==
        "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nSay hi.\n\n### Response:\n");
  for (const auto& s : expected()["alpaca_samples"]) {
    const auto& row = expected()["alpaca_array.json"][&s - &expected()["alpaca_samples"][0]];
    const std::string input = row["input"].is_string() ? row["input"].get<std::string>() : "";
    CHECK(ax::data::alpaca_prompt(row["instruction"], input) == s["prompt"].get<std::string>());
  }
}

TEST_CASE("alpaca: samples equal the tokenizers package's ids, loss on the output and EOS, from every file format") {
  auto tok = ax::load_hf_tokenizer(std::string(AXENGINE_TEST_DATA_DIR) + "/tokenizers/qwen2_bytelevel");
  auto dir = ax::test::scratch_dir("data_files_alpaca");
  std::vector<std::string> files{"alpaca_array.json", "alpaca_lines.json"};
  if (ax::data::parquet_supported()) files.insert(files.end(), {"alpaca.parquet", "sharded/*.parquet"});
  for (const auto& f : files) {
    CAPTURE(f);
    write(dir / "run.toml", "[data]\ncache = false\neval_fraction = 0\nsequence_len = 512\n[[datasets]]\ntype = \"alpaca\"\n"
                            "path = \"" + kFixtures + f + "\"\n");
    auto d = prepare(dir / "run.toml", *tok);
    const auto& want = expected()["alpaca_samples"];
    REQUIRE(d.train.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CHECK(d.train[i].input_ids == want[i]["input_ids"].get<std::vector<int32_t>>());
      CHECK(d.train[i].labels == want[i]["labels"].get<std::vector<int32_t>>());
    }
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("alpaca: mapped columns, bad rows named, and completion points alpaca rows to the alpaca type") {
  ax::test::ByteTokenizer tok;
  auto dir = ax::test::scratch_dir("data_files_alpaca_map");
  // Dolly's columns: instruction, context, response.
  write(dir / "dolly.json", R"([{"instruction": "I", "context": "C", "response": "R"},
                                {"instruction": "J", "context": null, "response": "S"},
                                {"instruction": "K", "response": 7}])");
  const std::string entry = "[data]\ncache = false\neval_fraction = 0\n[[datasets]]\ntype = \"alpaca\"\npath = \"dolly.json\"\n"
                            "input_field = \"context\"\noutput_field = \"response\"\n";
  write(dir / "run.toml", entry);
  CHECK(error_of([&] { prepare(dir / "run.toml", tok); }).find("dolly.json: element 2: field 'response' must be a string") != std::string::npos);
  write(dir / "skip.toml", entry + "on_bad_row = \"skip\"\n");
  auto d = prepare(dir / "skip.toml", tok);
  REQUIRE(d.train.size() == 2);
  const std::string p0 = ax::data::alpaca_prompt("I", "C"), p1 = ax::data::alpaca_prompt("J", "");
  CHECK(d.train[0].input_ids.size() == p0.size() + 2);  // + "R" + EOS
  CHECK(d.train[0].labels[p0.size() - 1] == -100);
  CHECK(d.train[0].labels[p0.size()] == 'R');
  CHECK(d.train[1].input_ids.size() == p1.size() + 2);
  write(dir / "bad_key.toml", entry + "response_field = \"x\"\n");
  CHECK_THROWS_WITH_AS(prepare(dir / "bad_key.toml", tok), doctest::Contains("response_field"), ax::ConfigError);

  write(dir / "alpaca.jsonl", "{\"instruction\": \"I\", \"input\": \"\", \"output\": \"O\"}\n");
  write(dir / "completion.toml", "[data]\ncache = false\n[[datasets]]\ntype = \"completion\"\npath = \"alpaca.jsonl\"\n");
  CHECK(error_of([&] { prepare(dir / "completion.toml", tok); }).find("alpaca.jsonl:1: field 'text' is missing (rows with 'instruction' and 'output' are type = \"alpaca\")") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("pretokenized: mapped columns; an id beyond the model's vocabulary names file and row, cached or not") {
  ax::test::ByteTokenizer tok;
  auto dir = ax::test::scratch_dir("data_files_pretok");
  fs::create_directories(dir / "shards");
  write(dir / "shards" / "a.json", R"([{"ids": [1, 2, 3], "lab": [-100, 2, 3]}])");
  write(dir / "shards" / "b.jsonl", "{\"ids\": [4, 5]}\n\n{\"ids\": [6, 250, 7]}\n");
  write(dir / "run.toml", "[data]\ncache_dir = \"cache\"\neval_fraction = 0\n[[datasets]]\ntype = \"pretokenized\"\n"
                          "path = \"shards/*\"\ninput_ids_field = \"ids\"\nlabels_field = \"lab\"\n");
  for (bool cached : {false, true}) {  // the second time the samples come from the prepared-data cache
    CAPTURE(cached);
    auto err = error_of([&] { prepare(dir / "run.toml", tok, /*model_vocab=*/200); });
    CHECK(err.find("shards/b.jsonl:3: token 1 = 250 is beyond the model's vocabulary (config.json vocab_size 200") != std::string::npos);
  }
  auto d = prepare(dir / "run.toml", tok);
  REQUIRE(d.train.size() == 3);
  CHECK(d.sources[0].from_cache);
  CHECK(d.train[0].labels == std::vector<int32_t>{-100, 2, 3});
  CHECK(d.train[1].labels == std::vector<int32_t>{4, 5});
  // A file the glob newly matches is seen: the cache key covers every matched file.
  write(dir / "shards" / "c.jsonl", "{\"ids\": [8, 8]}\n{\"ids\": [9, 9]}\n");
  CHECK(prepare(dir / "run.toml", tok).train.size() == 5);
  if (ax::data::parquet_supported()) {
    write(dir / "pq.toml", "[data]\ncache_dir = \"cache\"\neval_fraction = 0\n[[datasets]]\ntype = \"pretokenized\"\n"
                           "path = \"" + kFixtures + "pretok.parquet\"\n");
    auto p = prepare(dir / "pq.toml", tok);
    REQUIRE(p.train.size() == 3);
    CHECK(p.train[1].input_ids == std::vector<int32_t>{3, 4});  // attention_mask 0 dropped
    CHECK(p.train[2].labels == std::vector<int32_t>{7, 8});     // labels null: the ids
    auto err = error_of([&] { prepare(dir / "pq.toml", tok, /*model_vocab=*/6); });
    CHECK(err.find("pretok.parquet: row 0: token 2 = 9 is beyond the model's vocabulary") != std::string::npos);
  }
  ax::test::remove_tree(dir);
}
