// A family is one description (models/family.hpp, models/families/<name>.cpp): docs/models.md's family table is
// held to the descriptions, and no other file of the model layer tests a model_type string.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "models/family.hpp"
#include "models/hf_config.hpp"

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::size_t b = 1;  // after the leading '|'
  for (std::size_t e; (e = row.find(" | ", b + 1)) != std::string::npos && out.size() < 3; b = e + 2)
    out.push_back(row.substr(b + 1, e - b - 1));
  return out;
}

}  // namespace

TEST_CASE("models: docs/models.md's family table is the families' descriptions") {
  const std::string doc = slurp(fs::path(AXENGINE_SOURCE_DIR) / "docs/models.md");
  const auto head = doc.find("| model_type | config class | init-model presets | notes |\n| --- | --- | --- | --- |\n");
  REQUIRE(head != std::string::npos);
  std::istringstream rows(doc.substr(doc.find("| ---", head)));
  std::string row;
  std::getline(rows, row);  // the separator
  std::vector<std::vector<std::string>> table;
  while (std::getline(rows, row) && row.rfind("| ", 0) == 0) table.push_back(cells(row));
  const auto& all = ax::models::families();
  REQUIRE(table.size() == all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const ax::models::Family& f = *all[i];
    CAPTURE(f.name);
    REQUIRE(table[i].size() == 3);
    CHECK(table[i][0] == f.name);
    CHECK(table[i][1] == f.config_class);
    std::vector<std::string> presets;
    for (const auto& p : f.presets) presets.push_back(p.name);
    CHECK(table[i][2] == ax::join(presets, ", "));
  }
}

TEST_CASE("models: every family's presets and class defaults are its own") {
  std::vector<std::string> all_presets;
  for (const ax::models::Family* f : ax::models::families()) {
    CAPTURE(f->name);
    CHECK(ax::models::find_family(f->name) == f);
    CHECK(!f->presets.empty());
    CHECK(bool(f->read));
    if (f->per_expert) CHECK(f->moe);  // per-expert names only where there are experts
    for (const auto& p : f->presets) all_presets.push_back(p.name);
  }
  // init-model offers exactly the descriptions' presets (and the VL models', which are not decoder families).
  all_presets.push_back("tiny-qwen2_5-vl");
  all_presets.push_back("tiny-qwen3-vl");
  all_presets.push_back("tiny-qwen3-vl-moe");
  all_presets.push_back("tiny-gemma3-mm");
  CHECK(ax::model_presets() == all_presets);
  CHECK(ax::models::find_family("gemma3") == nullptr);  // the multimodal Gemma 3 is a model of its own (gemma3_mm.cpp)
  CHECK(ax::models::refused_type_message("gemma3") == "");
  CHECK(ax::models::refused_type_message("llama") == "");
}

TEST_CASE("models: no file of the model layer but the family's own tests a model_type string") {
  // A comparison of a model_type (or of the config's "model_type" value) with a literal: the knowledge of a
  // family belongs in its description. qwen2_5_vl's and gemma3_mm's own files (models of their own) read their own config.
  const std::regex test_of_type(R"re((model_type\s*[!=]=\s*")|("\s*[!=]=\s*(c|cfg|cfg_|config)\.model_type)|(is_gpt_oss))re");
  const fs::path models = fs::path(AXENGINE_SOURCE_DIR) / "core/src/models";
  int scanned = 0;
  for (const auto& e : fs::recursive_directory_iterator(models)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), models).generic_string();
    if (rel.rfind("families/", 0) == 0 || rel.rfind("qwen2_5_vl", 0) == 0 || rel.rfind("gemma3_mm", 0) == 0) continue;
    ++scanned;
    const std::string text = slurp(e.path());
    std::smatch m;
    CAPTURE(rel);
    CHECK_FALSE(std::regex_search(text, m, test_of_type));
  }
  CHECK(scanned > 20);
}
