// Data where HF datasets users keep it (data/dataset_source.hpp, data/arrow_rows.hpp) and `split` slices
// (data/split_spec.hpp): directories written by save_to_disk (a Dataset in shards, a DatasetDict, one saved after
// set_format(columns=...)), a datasets cache directory, and JSONL/Parquet files, each read through a split exactly
// as datasets reads it; the slice arithmetic against ReadInstruction.to_absolute; what datasets refuses, refused;
// bad directories (a missing shard, a newer layout, a missing split, a slice that selects nothing) named.
// Fixtures and goldens: tests/data/datasets/arrow/, written by scripts/goldens/make_arrow_fixtures.py with datasets.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "data/dataset_source.hpp"
#include "data/jsonl.hpp"
#include "data/split_spec.hpp"
#include "test_util.hpp"
#include "unit/test_paths.hpp"
#include "unit/tiny_model.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kArrow = std::string(AXENGINE_TEST_DATA_DIR) + "/datasets/arrow";

const nlohmann::json& expected() {
  static const nlohmann::json e = [] {
    std::ifstream in(kArrow + "/expected.json");
    return nlohmann::json::parse(in);
  }();
  return e;
}

nlohmann::json rows_of(const std::string& path, const std::string& split) {
  auto contents = ax::data::read_rows(path, split, ax::data::BadRowPolicy::error, [](const nlohmann::json&) { return ""; });
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

std::string read_error(const std::string& path, const std::string& split = "") {
  return error_of([&] { rows_of(path, split); });
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A copy of a fixture directory to break.
fs::path copy_of(const std::string& fixture, const std::string& test) {
  fs::path dir = ax::test::scratch_dir(test) / fixture;
  fs::copy(kArrow + "/" + fixture, dir, fs::copy_options::recursive);
  return dir;
}

}  // namespace

TEST_CASE("split slices: the rows of datasets' ReadInstruction.to_absolute, rounding included") {
  int checked = 0;
  for (const auto& c : expected()["ranges"]) {
    const std::string spec = c["split"];
    const int64_t n = c["rows"];
    INFO(spec, " of ", n, " rows");
    if (c["ranges"].is_string()) {  // datasets refuses it (pct1_dropremainder on fewer than 100 rows)
      CHECK_THROWS_AS(
          [&] {
            for (const auto& p : ax::data::parse_split(spec)) ax::data::absolute_range(p, n);
          }(),
          ax::UsageError);
      continue;
    }
    const auto parts = ax::data::parse_split(spec);
    REQUIRE(parts.size() == c["ranges"].size());
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const auto r = ax::data::absolute_range(parts[k], n);
      CHECK(r.from == c["ranges"][k][0].get<int64_t>());
      CHECK(r.to == c["ranges"][k][1].get<int64_t>());
    }
    ++checked;
  }
  CHECK(checked > 250);
}

TEST_CASE("split slices: what datasets refuses is refused, naming the split") {
  for (const auto& c : expected()["errors"]) {
    const std::string spec = c["split"];
    INFO(spec, " (datasets: ", c["datasets"].get<std::string>(), ")");
    const std::string err = error_of([&] {
      for (const auto& p : ax::data::parse_split(spec)) ax::data::absolute_range(p, 100);
    });
    CHECK(err.find("split \"" + spec + "\"") != std::string::npos);
  }
}

TEST_CASE("datasets directories and files: the rows datasets returns for each split") {
  const std::map<std::string, std::string> sources{{"saved", "saved"}, {"dict", "dict"}, {"formatted", "formatted"},
                                                   {"rows.jsonl", "rows.jsonl"}, {"rows.parquet", "rows.parquet"},
                                                   {"cache", "cache"}};
  if (!ax::data::parquet_supported()) {
    CHECK(read_error(kArrow + "/saved").find("built without Arrow support") != std::string::npos);
    return;
  }
  int checked = 0;
  for (const auto& [key, rows] : expected()["rows"].items()) {
    const auto bar = key.find('|');
    const std::string source = key.substr(0, bar), split = key.substr(bar + 1);
    INFO(key);
    CHECK(rows_of(kArrow + "/" + sources.at(source), split) == rows);
    ++checked;
  }
  CHECK(checked == 28);
  // No split: every row of a one-split source; the "train" split of a DatasetDict.
  CHECK(rows_of(kArrow + "/saved", "") == expected()["rows"]["saved|train"]);
  CHECK(rows_of(kArrow + "/dict", "") == expected()["rows"]["dict|train"]);
  CHECK(rows_of(kArrow + "/saved/data-00001-of-00003.arrow", "").size() == 8);  // an Arrow IPC file by itself
}

TEST_CASE("datasets directories: rows name their shard and row") {
  if (!ax::data::parquet_supported()) return;
  auto check = [](const nlohmann::json& v) { return v.value("id", -1) == 17 ? std::string("id 17 is bad") : std::string(); };
  const std::string err = error_of([&] { ax::data::read_rows(kArrow + "/saved", "train[10:]", ax::data::BadRowPolicy::error, check); });
  CHECK(err.find("saved/data-00002-of-00003.arrow: row 1: id 17 is bad") != std::string::npos);
  auto skipped = ax::data::read_rows(kArrow + "/saved", "train[10:]", ax::data::BadRowPolicy::skip, check);
  CHECK(skipped.skipped == 1);
  CHECK(skipped.rows.size() == 12);
}

TEST_CASE("datasets directories: a missing shard, a newer layout, a missing split and an empty slice are named") {
  if (!ax::data::parquet_supported()) return;
  SUBCASE("a shard state.json lists is missing") {
    fs::path dir = copy_of("saved", "arrow_missing_shard");
    fs::remove(dir / "data-00001-of-00003.arrow");
    const std::string err = read_error(dir.string());
    CHECK(err.find("state.json lists data-00001-of-00003.arrow, which is missing") != std::string::npos);
    CHECK(err.find("incomplete") != std::string::npos);
  }
  SUBCASE("a state.json key of a newer datasets") {
    fs::path dir = copy_of("saved", "arrow_newer_state");
    auto state = nlohmann::json::parse(std::ifstream(dir / "state.json"));
    state["_storage_version"] = 2;
    write(dir / "state.json", state.dump());
    const std::string err = read_error(dir.string());
    CHECK(err.find("state.json: key '_storage_version' is unknown: written by a newer version of HF datasets") != std::string::npos);
  }
  SUBCASE("a feature type of a newer datasets") {
    fs::path dir = copy_of("saved", "arrow_newer_feature");
    auto info = nlohmann::json::parse(std::ifstream(dir / "dataset_info.json"));
    info["features"]["tags"]["feature"]["_type"] = "Tensor";
    write(dir / "dataset_info.json", info.dump());
    CHECK(read_error(dir.string()).find("feature type 'Tensor' is unknown: written by a newer version") != std::string::npos);
  }
  SUBCASE("an Arrow file that is not one") {
    fs::path dir = copy_of("saved", "arrow_damaged");
    write(dir / "data-00000-of-00003.arrow", "not arrow at all");
    CHECK(read_error(dir.string()).find("data-00000-of-00003.arrow: not a readable Arrow file") != std::string::npos);
  }
  SUBCASE("a DatasetDict split whose directory is gone") {
    fs::path dir = copy_of("dict", "arrow_dict_missing");
    fs::remove_all(dir / "test");
    CHECK(read_error(dir.string()).find("lists split test, but") != std::string::npos);
  }
  SUBCASE("a datasets cache dir with a split file missing, or fewer rows than it records") {
    fs::path dir = copy_of("cache", "arrow_cache_partial");
    fs::remove(dir / "json-validation.arrow");
    CHECK(read_error(dir.string()).find("lists json-validation.arrow, which is missing") != std::string::npos);
    fs::copy_file(kArrow + "/cache/json-validation.arrow", dir / "json-validation.arrow");
    fs::copy_file(kArrow + "/cache/json-validation.arrow", dir / "json-train.arrow", fs::copy_options::overwrite_existing);
    CHECK(read_error(dir.string(), "train").find("split \"train\" has 4 rows in its files but dataset_info.json records 10") !=
          std::string::npos);
  }
  SUBCASE("a split the source lacks") {
    CHECK(read_error(kArrow + "/dict", "validation").find("has no split \"validation\" (its splits: train, test)") != std::string::npos);
    CHECK(read_error(kArrow + "/rows.jsonl", "test").find("has no split \"test\" (its split: train)") != std::string::npos);
  }
  SUBCASE("a slice past the end") {
    const std::string err = read_error(kArrow + "/saved", "train[30:40]");
    CHECK(err.find("split \"train[30:40]\" selects no row: the split \"train\" has 23 rows") != std::string::npos);
  }
  SUBCASE("a datasets cache dir load_dataset has not finished") {
    fs::path dir = ax::test::scratch_dir("arrow_incomplete") / "0123abcd.incomplete";
    fs::create_directories(dir);
    fs::copy_file(kArrow + "/cache/json-train.arrow", dir / "json-train-00000-of-00002.arrow");
    CHECK(read_error(dir.string()).find("a load_dataset that did not finish") != std::string::npos);
  }
  SUBCASE("a directory datasets did not write") {
    fs::path dir = ax::test::scratch_dir("arrow_plain_dir");
    write(dir / "a.jsonl", "{}\n");
    CHECK(read_error(dir.string()).find("a directory, but not one HF datasets wrote") != std::string::npos);
  }
}

TEST_CASE("datasets directories: the prepared-data cache key covers the files inside") {
  const auto files = ax::data::dataset_dir_files(kArrow + "/dict");
  CHECK(files.size() == 8);  // dataset_dict.json; per split state.json, dataset_info.json and its shards
  CHECK(std::find(files.begin(), files.end(), kArrow + "/dict/train/data-00001-of-00002.arrow") != files.end());
}

TEST_CASE("datasets directories cli: validate reads a DatasetDict through split and eval_split, and refuses what conflicts") {
  if (!ax::data::parquet_supported()) return;
  ax_test::TempDir dir;
  ax::test::make_tiny_llama(dir.path / "model");
  const std::string env = "AXENGINE_CACHE_DIR=" + (dir / "prepared") + " OMP_NUM_THREADS=1 ";
  auto config = [&](const std::string& extra) {
    ax_test::write_file(dir / "run.toml",
                        "[run]\noutput_dir = \"out\"\n[model]\npath = \"model\"\n[data]\nsequence_len = 16\n"
                        "[[datasets]]\ntype = \"completion\"\npath = \"" + kArrow + "/dict\"\nprompt_field = \"prompt\"\n" + extra +
                        "[lora]\nr = 4\nalpha = 8\n[train]\nmax_steps = 2\nmicro_batch_size = 1\ncpu_threads = 1\n"
                        "[eval]\nexact_match = false\n");
    return ax_test::run(env + ax_test::axengine() + " validate --config " + (dir / "run.toml"));
  };
  auto r = config("split = \"train[:50%]\"\neval_split = \"test[1:]\"\n");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("5 train / 3 eval samples") != std::string::npos);
  r = config("split = \"train[20:30]\"\n");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("split \"train[20:30]\" selects no row: the split \"train\" has 10 rows") != std::string::npos);
  r = config("eval_split = \"test\"\neval_fraction = 0.1\n");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("'eval_split' and 'eval_fraction' both choose the evaluation rows") != std::string::npos);
  r = config("split = \"validation\"\n");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("has no split \"validation\" (its splits: train, test)") != std::string::npos);
}
