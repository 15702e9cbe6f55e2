// Datasets: a dataset type (registry kind "dataset") opens one [[datasets]] entry of the run config and
// yields tokenised samples; the engine packs, caches, shuffles and batches them. Plugins add types
// (e.g. multimodal ones) without touching core.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace ax {

class Tokenizer;

// One training example. labels[i] == -100 means "no loss at position i" (HF convention).
struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  // Must be safe to call from several threads at once: the engine tokenises in parallel.
  virtual Sample get(std::size_t index) const = 0;
  // Rows dropped under on_bad_row = "skip" (reported to the user).
  virtual std::size_t skipped_rows() const { return 0; }
};

struct DatasetContext {
  const Tokenizer* tokenizer = nullptr;
  std::string config_file;   // for error messages
  std::string base_dir;      // relative paths in the entry resolve against this
};

class DatasetType {
 public:
  virtual ~DatasetType() = default;
  // `entry` is the whole [[datasets]] table. Unknown or ill-typed keys must be rejected with a
  // ConfigError naming the key; `known_keys` feeds "did you mean".
  virtual std::vector<std::string> known_keys() const = 0;
  virtual std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const = 0;
};

}  // namespace ax
