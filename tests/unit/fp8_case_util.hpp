// A fine-grained FP8 test case (tests/data/models/<case>, scripts/goldens/make_fp8_goldens.py) with its tensors
// and config edited, in a scratch dir: the fp8 tests' bad inputs and block-size variants.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/safetensors.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"

namespace ax::test {

using Fp8Tensors = std::vector<std::pair<std::string, at::Tensor>>;

struct EditedFp8 {
  std::filesystem::path dir;
  template <class TensorEdit, class ConfigEdit>
  EditedFp8(TensorEdit edit, ConfigEdit cfg_edit, const std::string& base = "deepseek_v3_fp8")
      : dir(scratch_dir("fp8_edit")) {
    auto ckpt = safetensors::Checkpoint::open_dir(case_dir(base).string());
    Fp8Tensors t;
    for (const auto& n : ckpt.names()) t.emplace_back(n, ckpt.get(n));
    edit(t);
    safetensors::save((dir / "model.safetensors").string(), t);
    nlohmann::json cfg = config_of(base);
    cfg_edit(cfg);
    std::ofstream(dir / "config.json") << cfg.dump();
  }
  ~EditedFp8() { remove_tree(dir); }
};

}  // namespace ax::test
