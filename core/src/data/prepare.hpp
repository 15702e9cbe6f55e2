// From [[datasets]] to tokenised train/eval samples: each entry is opened through its registered type,
// tokenised in parallel (oneTBB), cached on disk under a hash of (entry, data files' size and content hash
// (XXH3-128 of their bytes), tokenizer fingerprint), and split into train/eval (eval_path, or a seeded eval_fraction).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/dataset.hpp"
#include "axengine/registry.hpp"
#include "axengine/tokenizer.hpp"
#include "data/data_config.hpp"
#include "data/stream_feed.hpp"

namespace ax::data {

struct SourceReport {
  std::string name;
  std::size_t train = 0, eval = 0, skipped = 0;
  std::size_t no_loss = 0;  // samples dropped (on_bad_row = "skip") for having no token to train on
  std::size_t unfit = 0;    // samples dropped (on_bad_row = "skip") that data.sequence_len would cut where they cannot be cut
  bool from_cache = false;
  std::string cache_file;
  std::size_t shards = 0;  // > 0: streamed from that many shards (train stays empty; PreparedData::stream)
};

struct PreparedData {
  std::vector<Sample> train, eval;
  std::vector<SourceReport> sources;
  // The dataset type whose samples carry extras: it collates every batch (make_batch). Null when no sample
  // has extras. Two types with extras in one run are refused (whose collate would own a mixed batch?).
  std::shared_ptr<const DatasetType> collator;
  std::string collator_type;
  // A streamed entry's samples (`streaming = true`): `train` is then empty and the trainer reads rows from it.
  std::shared_ptr<StreamFeed> stream;
};

// `model_vocab` (config.json vocab_size; 0 = unknown) bounds the token ids together with the tokenizer's.
// `image_processor` is the model's (DatasetContext::image_processor: its family's, which the caller that
// assembles the run knows, model_image_processor in axengine/models.hpp; "" = the model takes no images).
// Samples without a token to train on within data.sequence_len are an error naming file:line, or dropped and
// counted (SourceReport::no_loss) under on_bad_row = "skip".
PreparedData prepare_datasets(const RunConfig& config, const DataConfig& data, const Registry& registry,
                              const Tokenizer& tokenizer, int64_t model_vocab = 0, const std::string& image_processor = "");

// The cache key of one dataset file as an entry describes it (exposed for tests).
std::string dataset_cache_key(const std::string& type, const toml::table& entry, const std::string& base_dir,
                              const Tokenizer& tokenizer);

// "name: 900 train / 100 eval samples (cached)" lines.
std::string describe(const PreparedData& data);

}  // namespace ax::data
