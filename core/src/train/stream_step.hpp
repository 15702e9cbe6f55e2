// The training loop's side of a streamed dataset (data/stream_feed.hpp): the rows of one step read from the
// stream, and the stream's position in a checkpoint.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/packing.hpp"
#include "data/stream_feed.hpp"

namespace ax::train {

// One rank's micro-batches of a step: samples[j] packed as rows[j] (rows 0 .. micro_batch_size - 1).
struct StreamedStep {
  std::vector<std::vector<Sample>> samples;
  std::vector<data::PackedRows> rows;
  int64_t tokens = 0, trainable = 0;  // of the whole step, every rank's rows
  uint64_t pass = 0;                  // the pass over the shards the step's first row came from
  // The feed's cursor once the step was read: what a checkpoint written after this step records (with
  // prefetch the feed itself is steps ahead, stream_prefetch.hpp).
  StreamCursor next;
  std::vector<Batch> batches;  // the trainer's micro-batches of `samples`, when its producer makes them
};

// Reads the step's micro_batch_size x grad_accum x world rows, in stream order; rank k's micro-batch j takes
// rows (j * world + k) * micro_batch_size ... + micro_batch_size - 1, as a map-style step takes its rows from the
// epoch's order. Every rank reads (and tokenises) every row of the step, so all ranks agree on the rows and the
// cursor without a collective; each trains on its own. A sample left deferred (StreamFeed's
// set_materialise_eagerly(false): mm_cpt's pixels) is materialised only here and only in the rank's own rows,
// so each rank decodes only the images it trains on.
StreamedStep read_streamed_step(data::StreamFeed& feed, int64_t micro_batch_size, int64_t grad_accum, int64_t world,
                                int64_t rank, int64_t sequence_len);
// Runs the materialise of every sample that has one, in parallel; rethrows the first failure in order.
void materialise(std::vector<std::vector<Sample>>& samples);

// trainer_state.json's data_stream: the cursor (StreamedStep::next of the last trained step) and what must
// match for a resume to continue it.
nlohmann::json stream_state(const StreamCursor& cursor, int64_t sequence_len, int64_t rows_per_step);
// Seeks `feed` to a checkpoint's data_stream; UsageError naming `dir` when it lacks one or was written with
// another sequence_len or rows per step (the rows would not be the ones the uninterrupted run trains on).
void resume_stream(data::StreamFeed& feed, const std::optional<nlohmann::json>& state, int64_t sequence_len,
                   int64_t rows_per_step, const std::string& dir);

}  // namespace ax::train
