// The training side of a streamed dataset (docs/datasets.md, "Streaming"): the entry's SampleStream, checked
// sample by sample as prepare_datasets checks map-style samples, packed into rows of sequence_len tokens with
// a one-sample lookahead (the packer's whole buffer), repeated pass after pass until the run's max_steps.
// Its cursor (that of the first sample not yet in a returned row) goes into the checkpoint.
// A sample a type returns with Sample::materialise set (mm_cpt: pixels not decoded yet) is materialised at once
// (one rank: today's semantics, on_bad_row included) or, with several data-parallel ranks, left to the rank
// that trains it (read_streamed_step), wrapped so that its errors name the row and its extras are checked.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/stream.hpp"
#include "axengine/tokenizer.hpp"
#include "data/data_config.hpp"
#include "data/entry.hpp"
#include "data/jsonl.hpp"

namespace ax::data {

class SampleFit;  // data/types.hpp

class StreamFeed {
 public:
  StreamFeed(std::unique_ptr<SampleStream> stream, std::string name, int64_t sequence_len, int64_t tokenizer_vocab,
             int64_t model_vocab, BadRowPolicy policy);

  // The next packed row: its samples in stream order, the first cut to sequence_len when longer (as pack_samples
  // does). The stream starts its next pass at the end of the last shard; a pass without one usable row is an
  // error (nothing would ever be trained on).
  std::vector<Sample> next_row();
  // Where a resumed run continues: the first sample not yet in a returned row.
  StreamCursor cursor() const;
  void seek(const StreamCursor& c);

  const std::string& name() const { return name_; }
  const SampleStream& stream() const { return *stream_; }
  std::size_t no_loss() const { return no_loss_; }
  // Rows dropped under on_bad_row = "skip" because materialising them failed (their pixels would not decode).
  std::size_t skipped_late() const { return skipped_late_; }

  // true (the default): a sample's materialise runs as it is read, and a failure follows on_bad_row like any bad
  // row. false (several data-parallel ranks): it is left in the sample for the rank that trains it; a failure
  // then stops the run whatever on_bad_row says (the row is packed on every rank: skipping it on one would give
  // the ranks different rows).
  void set_materialise_eagerly(bool eager) { eager_ = eager; }
  // A type whose samples must not be cut (data/types.hpp): a sample that does not fit sequence_len is a bad
  // row (on_bad_row), as prepare drops it from map-style data.
  void set_fit(const SampleFit* fit) { fit_ = fit; }

 private:
  bool fetch(Sample& out);  // the next usable sample, across passes
  void check(const Sample& s);
  void check_extras(const Sample& s, const std::string& where);

  std::unique_ptr<SampleStream> stream_;
  std::string name_;
  int64_t sequence_len_, tokenizer_vocab_, model_vocab_;
  BadRowPolicy policy_;
  std::optional<Sample> held_;  // read, did not fit the last row
  StreamCursor held_at_;        // the cursor before it
  uint64_t held_pass_ = 0;      // the pass it was read in
  std::size_t no_loss_ = 0, skipped_late_ = 0;
  bool eager_ = true;
  const SampleFit* fit_ = nullptr;
  std::mutex extras_mutex_;     // deferred samples are materialised (and checked) in parallel
  uint64_t pass_samples_ = 0;   // usable samples in the current pass
  std::map<std::string, std::pair<at::ScalarType, std::vector<int64_t>>> extras_;  // dtype and dims 1.. per name
};

// A [[datasets]] entry with `streaming = true`, checked against the rest of the run config (one streaming entry
// and nothing else, train.max_steps set, no num_epochs, nothing held out by eval_fraction; each a ConfigError
// at its file:line:col) and opened as a stream through its type (which must implement StreamingDatasetType).
std::shared_ptr<StreamFeed> open_stream_entry(const RunConfig& config, const toml::table& entry, const toml::table& type_entry,
                                              const CommonEntry& common, const DatasetType& type, const DatasetContext& ctx,
                                              const DataConfig& data, const Tokenizer& tokenizer, int64_t model_vocab,
                                              std::size_t entries);

}  // namespace ax::data
