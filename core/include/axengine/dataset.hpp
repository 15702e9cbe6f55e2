// Datasets: a dataset type (registry kind "dataset") opens one [[datasets]] entry of the run config and
// yields tokenised samples; the engine packs, caches, shuffles and batches them. Plugins add types
// (e.g. multimodal ones) without touching core.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <toml++/toml.h>

namespace ax {

class Tokenizer;

// One training example. labels[i] == -100 means "no loss at position i" (HF convention).
struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
  // Named extra tensors (CPU) the dataset type attaches: pixel values, image grids, per-token position ids
  // of several axes... Dim 0 may vary from sample to sample; the other dims and the dtype of one name must
  // be the same in every sample of a dataset (checked when the data is prepared; the prepared-data cache
  // stores them). The type's collate() turns them into the batch's extras.
  std::map<std::string, at::Tensor> extras;
  // Set by a type's stream (SampleStream::next, axengine/stream.hpp) for a sample whose ids, labels and cheap
  // extras are final but whose costly extras are not made yet (mm_cpt: the image tokens are counted from the
  // headers, the pixels not decoded). Core calls it once, on the data-parallel rank that trains the sample
  // (every other rank packs the sample by its length and drops it), and clears it; it adds the rest of
  // `extras` and may throw (a UsageError: core prefixes the row). Empty for every other sample; a map-style
  // Dataset::get must return complete samples (prepare refuses one with materialise set).
  std::function<void(Sample&)> materialise;
};

// Where the samples of a batch landed: sample `sample` fills tokens [offset, offset + length) of row `row`
// (length < input_ids.size() when it was cut to the sequence length).
struct SamplePlacement {
  const Sample* sample = nullptr;
  int64_t row = 0, offset = 0, length = 0;
};
struct BatchLayout {
  int64_t rows = 0, sequence_len = 0;
  std::vector<SamplePlacement> samples;  // in row order, then offset order
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
  // The model directory of the run ([model].path, resolved): where a type finds the model's own files, such
  // as chat_template.jinja and tokenizer_config.json (the chat_template type). "" when no model is known.
  std::string model_dir;
  // The kind of image processor the model reads ("qwen2_vl", "gemma3": named after transformers' image processor
  // classes), from its family's description where the run is assembled; "" for a text-only model or none known.
  // The chat_template type asks the plugins for a processor of this kind (axengine/chat_media.hpp).
  std::string image_processor;
};

class DatasetType {
 public:
  virtual ~DatasetType() = default;
  // `entry` is the whole [[datasets]] table. Unknown or ill-typed keys must be rejected with a
  // ConfigError naming the key; `known_keys` feeds "did you mean".
  virtual std::vector<std::string> known_keys() const = 0;
  virtual std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const = 0;
  // Collates the extras of a batch's samples (on the host) into Batch::extras; called whenever a batch is
  // built from data of this type that carries extras. Samples of other types (or without extras) in the
  // same batch are this hook's to fill. The default collates per-token extras: each extra whose dim 0 is
  // its sample's token count becomes [B, S, ...] (zeros at padding and where a sample lacks it, cut with
  // the sample); any other extra is a UsageError telling the type to override collate().
  virtual std::map<std::string, at::Tensor> collate(const BatchLayout& layout) const;
};

// The default collation above, of the extras named in `names` (all when empty), for types that extend it.
std::map<std::string, at::Tensor> collate_per_token_extras(const BatchLayout& layout, const std::vector<std::string>& names = {});

}  // namespace ax
