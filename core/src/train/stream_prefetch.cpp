// The streamed steps' background producer (stream_prefetch.hpp says why: the device must not wait for the
// host's reading and decoding of the next step's rows).
#include "train/stream_prefetch.hpp"

#include <chrono>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

StreamPrefetcher::StreamPrefetcher(Produce produce, int64_t steps, int64_t depth)
    : produce_(std::move(produce)), steps_(steps), depth_(depth) {
  if (depth_ < 0) throw RuntimeError(ax::str("stream prefetch depth ", depth_, " < 0"));
  if (depth_ > 0 && steps_ > 0) worker_ = std::thread([this] { work(); });
}

StreamPrefetcher::~StreamPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void StreamPrefetcher::work() {
  for (int64_t made = 0; made < steps_; ++made) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || static_cast<int64_t>(ready_.size()) < depth_; });
      if (stop_) break;
    }
    // Outside the lock: the training thread takes ready steps meanwhile. Nothing escapes the thread (an
    // exception leaving it would be std::terminate): it is handed to next().
    try {
      StreamedStep step = produce_();
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(step));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      break;  // the steps after a failed one cannot be made: the feed stopped inside it
    }
    changed_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
  }
  changed_.notify_all();
}

StreamedStep StreamPrefetcher::next() {
  if (given_ >= steps_) throw RuntimeError(ax::str("stream prefetch: step ", given_ + 1, " asked of ", steps_));
  const auto t0 = std::chrono::steady_clock::now();
  if (depth_ == 0) {  // the training thread makes the step: all of that time is waiting for data
    last_wait_s_ = 0;
    StreamedStep step = produce_();
    last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++given_;
    return step;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || finished_; });
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (ready_.empty()) {
    // finished_ with nothing ready: produce() failed on this very step (the steps before it were taken).
    if (error_) std::rethrow_exception(error_);
    throw RuntimeError("stream prefetch: the worker stopped without the step");  // stop_ is only set by the destructor
  }
  StreamedStep step = std::move(ready_.front());
  ready_.pop_front();
  ++given_;
  lock.unlock();
  changed_.notify_all();
  return step;
}

}  // namespace ax::train
