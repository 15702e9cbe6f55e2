// What the model family tests share: the committed test cases under tests/data/models/, config.json parse
// errors as text, and a scratch model dir with a case's weights under an edited config.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "models/hf_config.hpp"
#include "unit/test_paths.hpp"

namespace ax::test {

inline std::filesystem::path case_dir(const std::string& name) {
  return std::filesystem::path(AXENGINE_TEST_DATA_DIR) / "models" / name;
}
inline nlohmann::json config_of(const std::string& name) {
  return ax::models::read_json_file((case_dir(name) / "config.json").string());
}

// parse_hf_config's UsageError message for `j` (as "dir/config.json"); "" when it parses.
inline std::string parse_error(const nlohmann::json& j) {
  try {
    ax::models::parse_hf_config(j, "dir/config.json");
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

// A model dir with the weights of test case `name` and the config `cfg`; removed on destruction.
struct EditedModel {
  std::filesystem::path dir;
  EditedModel(const std::string& name, const nlohmann::json& cfg, const std::string& tag) : dir(scratch_dir(tag)) {
    std::filesystem::copy_file(case_dir(name) / "model.safetensors", dir / "model.safetensors");
    std::ofstream(dir / "config.json") << cfg.dump();
  }
  ~EditedModel() { remove_tree(dir); }
  EditedModel(const EditedModel&) = delete;
  EditedModel& operator=(const EditedModel&) = delete;
};

}  // namespace ax::test
