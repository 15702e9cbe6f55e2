// Why this exists: a streamed step's rows are read, tokenised and (mm_cpt) their images decoded and processed on
// the host as training reaches them. Done on the training thread right before the step, the device waits for
// that every step. The prefetcher produces the steps on a background thread, up to `depth` steps ahead of the
// one being trained (data.prefetch_steps; docs/datasets.md, "Streaming"), so reading step s+1 overlaps step s.
//
// What stays the same as without it: the steps come out in order, each as produce() made it (produce is only
// ever called from one thread at a time, in step order), so the rows, samples and losses are bitwise those of
// depth 0. The checkpoint's cursor is the one the consumed step carries (StreamedStep::next), never the
// feed's, which is ahead. An exception thrown by produce() (a bad row, an I/O error) is kept and rethrown by
// next() when the training thread reaches that step: the same exception object, hence the same type and
// message. The worker produces exactly `steps` steps (the run's remaining ones) and no more, so it reads and
// decodes exactly the rows the run does without it; the destructor stops it and joins it on every exit path.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "train/stream_step.hpp"

namespace ax::train {

class StreamPrefetcher {
 public:
  using Produce = std::function<StreamedStep()>;

  // Will give `steps` steps made by `produce`. depth > 0: a worker thread started here makes them, at most
  // `depth` ahead of next(); depth 0: next() calls produce() itself (no thread).
  StreamPrefetcher(Produce produce, int64_t steps, int64_t depth);
  // Stops the worker once the step it is making (if any) is done, and joins it. Never throws.
  ~StreamPrefetcher();
  StreamPrefetcher(const StreamPrefetcher&) = delete;
  StreamPrefetcher& operator=(const StreamPrefetcher&) = delete;

  // The next step, in order. Rethrows what produce() threw for this step; RuntimeError past `steps`.
  StreamedStep next();

  int64_t depth() const { return depth_; }
  // Seconds the last next() took to give its step: blocked waiting for the worker (0 when it had the step
  // ready), or at depth 0 making it. The training thread's wait on the data, metrics.jsonl's data_wait_s.
  double last_wait_s() const { return last_wait_s_; }

 private:
  void work();

  Produce produce_;
  const int64_t steps_, depth_;
  int64_t given_ = 0;  // steps next() returned
  double last_wait_s_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;  // a step was made or taken, or stop_ was set
  std::deque<StreamedStep> ready_;   // made, not yet taken
  std::exception_ptr error_;         // what produce() threw: next() rethrows it once ready_ is empty
  bool finished_ = false;            // the worker made its last step (or failed)
  bool stop_ = false;
  std::thread worker_;  // last: started once everything above is initialised
};

}  // namespace ax::train
