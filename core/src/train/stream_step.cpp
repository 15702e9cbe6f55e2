#include "train/stream_step.hpp"

#include <exception>
#include <optional>

#include <tbb/parallel_for.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

StreamedStep read_streamed_step(data::StreamFeed& feed, int64_t mb, int64_t ga, int64_t world, int64_t rank, int64_t S) {
  StreamedStep out;
  out.samples.resize(static_cast<std::size_t>(ga));
  out.rows.resize(static_cast<std::size_t>(ga));
  out.pass = feed.cursor().pass;
  for (int64_t j = 0; j < ga; ++j)
    for (int64_t k = 0; k < world; ++k)
      for (int64_t r = 0; r < mb; ++r) {
        std::vector<Sample> row = feed.next_row();
        std::vector<uint32_t> ids;
        for (const Sample& s : row) {
          const int64_t len = std::min<int64_t>(S, static_cast<int64_t>(s.input_ids.size()));
          out.tokens += len;
          // The targets the loss sees: labelled positions after the sample's first token (never predicted).
          for (int64_t i = 1; i < len; ++i) out.trainable += s.labels[static_cast<std::size_t>(i)] != -100;
        }
        if (k != rank) continue;  // another rank's: never materialised here
        auto& samples = out.samples[static_cast<std::size_t>(j)];
        auto& packed = out.rows[static_cast<std::size_t>(j)];
        for (Sample& s : row) {
          const int64_t len = static_cast<int64_t>(s.input_ids.size());
          packed.truncated += len > S;
          packed.tokens += static_cast<std::size_t>(std::min(len, S));
          ids.push_back(static_cast<uint32_t>(samples.size()));
          samples.push_back(std::move(s));
        }
        packed.rows.push_back(std::move(ids));
      }
  out.next = feed.cursor();
  materialise(out.samples);
  return out;
}

void materialise(std::vector<std::vector<Sample>>& samples) {
  std::vector<Sample*> todo;
  for (auto& mb : samples)
    for (Sample& s : mb)
      if (s.materialise) todo.push_back(&s);
  if (todo.empty()) return;
  // In parallel (mm_cpt: an image's decode is single-threaded); the first failure in step order is raised, as
  // reading the rows one by one would.
  std::vector<std::exception_ptr> failed(todo.size());
  tbb::parallel_for(std::size_t(0), todo.size(), [&](std::size_t i) {
    try {
      Sample& s = *todo[i];
      auto make = std::move(s.materialise);
      s.materialise = nullptr;
      make(s);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  });
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
}

nlohmann::json stream_state(const StreamCursor& cursor, int64_t sequence_len, int64_t rows_per_step) {
  return {{"cursor", cursor.to_json()}, {"sequence_len", sequence_len}, {"rows_per_step", rows_per_step}};
}

void resume_stream(data::StreamFeed& feed, const std::optional<nlohmann::json>& state, int64_t sequence_len,
                   int64_t rows_per_step, const std::string& dir) {
  if (!state)
    throw UsageError(ax::str(dir, ": the checkpoint has no data stream cursor (a map-style run wrote it); a streamed run "
                             "resumes only its own checkpoints"));
  const nlohmann::json& j = *state;
  auto number = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer())
      throw UsageError(ax::str(dir, ": trainer_state.json: data_stream lacks the integer '", key, "'"));
    return it->get<int64_t>();
  };
  const int64_t s = number("sequence_len"), r = number("rows_per_step");
  if (s != sequence_len || r != rows_per_step)
    throw UsageError(ax::str(dir, ": the streamed run was packed into ", r, " rows of ", s, " tokens a step, this one into ",
                             rows_per_step, " of ", sequence_len, " (data.sequence_len, micro_batch_size x grad_accum x ranks); "
                             "resume needs the same ones"));
  auto c = j.find("cursor");
  if (c == j.end()) throw UsageError(ax::str(dir, ": trainer_state.json: data_stream lacks its 'cursor'"));
  const StreamCursor cursor = StreamCursor::from_json(*c, dir + "/trainer_state.json");
  try {
    feed.seek(cursor);
  } catch (const UsageError& e) {
    throw UsageError(ax::str(dir, ": resume: ", e.what()));
  }
}

}  // namespace ax::train
