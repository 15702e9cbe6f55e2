#include "train/trainer.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Event.h>

#include "axengine/crash_point.hpp"
#include "axengine/error.hpp"
#include "axengine/executor.hpp"
#include "axengine/interrupted.hpp"
#include "axengine/log.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/profiler.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "data/packing.hpp"
#include "data/static_shapes.hpp"
#include "stop_signal.hpp"
#include "train/append_record.hpp"
#include "train/checkpoint.hpp"
#include "train/dist_expert.hpp"
#include "train/dist_reducer.hpp"
#include "train/generate.hpp"
#include "train/progress.hpp"
#include "train/report.hpp"
#include "train/schedule.hpp"
#include "train/step_plan.hpp"
#include "train/stream_prefetch.hpp"
#include "train/stream_step.hpp"
#include "train/tensorboard.hpp"

namespace fs = std::filesystem;

namespace ax::train {

bool exempt_from_weight_decay(const std::string& name, const at::Tensor& t) {
  if (t.dim() < 2) return true;
  auto ends_with = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends_with(".bias") || ends_with("_bias") || name.find("norm") != std::string::npos;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double peak_memory(const DeviceInfo& device) {
  if (device.is_cuda()) {
    auto stats = c10::getDeviceAllocator(at::kCUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(device.index));
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;
}

// The cores this process may run on (its affinity mask: taskset and cgroup cpusets shrink it), at least 1.
int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
}

// train.cpu_threads, clamped to the usable cores: more intra-op threads than cores only makes them wait for
// each other (a step took over 60 s with 64 threads on 2 cores).
int64_t intra_op_threads(int64_t requested) {
  if (requested <= 0) return 0;
  const int64_t cores = usable_cores();
  if (requested <= cores) return requested;
  log::warn(ax::str("train.cpu_threads = ", requested, " is more than the ", cores, " cores this process may use; using ", cores));
  return cores;
}

// What a rank asks of the others at a step boundary (a distributed run decides these together: each rank's
// requests ride in its step's all-reduce, summed, so every rank reads the same sums with that step's
// statistics and acts at the same boundary). Alone, the process reads its own at each boundary.
enum Flag : int64_t { kSigInt, kSigTerm, kSigUsr1, kWriteFailed, kSaveDue, kFlags };

// checkpoint.every_minutes: seconds since the last checkpoint (or the start) on the steady clock, or, under the
// test hook AXENGINE_TEST_CLOCK_STEP_S=<s>, on a clock that advances s seconds at each step boundary, so that a
// test of time-based saves does not depend on how fast the machine is.
class SaveClock {
 public:
  explicit SaveClock(double every_minutes) : every_s_(every_minutes * 60) {
    if (const char* v = std::getenv("AXENGINE_TEST_CLOCK_STEP_S"); v && *v) {
      char* end = nullptr;
      step_s_ = std::strtod(v, &end);
      if (*end || !(step_s_ >= 0)) throw UsageError(ax::str("AXENGINE_TEST_CLOCK_STEP_S='", v, "': expected seconds >= 0"));
    }
    reset();
  }
  void step_done() { fake_s_ += step_s_ > 0 ? step_s_ : 0; }
  void reset() {
    since_ = Clock::now();
    fake_s_ = 0;
  }
  bool due() const { return every_s_ > 0 && (step_s_ >= 0 ? fake_s_ : seconds_since(since_)) >= every_s_; }

 private:
  double every_s_;
  double step_s_ = -1;  // < 0: the real clock
  double fake_s_ = 0;
  Clock::time_point since_;
};

// What the loop must do at a step boundary, besides what the config schedules.
struct Requests {
  int signal = 0;             // stop on this signal (SIGINT, SIGTERM, SIGUSR1), after a checkpoint
  bool write_failed = false;  // stop after a checkpoint: metrics.jsonl or the TensorBoard events could not be written
  bool save_due = false;      // checkpoint.every_minutes have passed since the last checkpoint
  bool stop() const { return signal != 0 || write_failed; }
};

// What a step leaves for the host: its micro-batch losses, the gradient norm and the sticky "not finite"
// flag, copied without blocking into pinned host memory behind an event, read once the GPU got there. The
// loop reads a step while the next one runs (CUDA), so nothing in a step waits for the GPU.
struct PendingStep {
  int64_t step = 0, tokens = 0, trainable = 0;
  int64_t pass = -1;  // a streamed step: the pass over the shards (its metrics' "epoch")
  double data_wait_s = -1;  // a streamed step: how long the host waited for its rows (stream_prefetch.hpp)
  double lr = 0;
  Clock::time_point started;
  at::Tensor host;                  // double [grad_accum + 2]: losses..., grad norm, found_inf
  at::Tensor flags;                 // with a group: double [kFlags], the ranks' requests summed
  std::optional<c10::Event> ready;  // CUDA: recorded after the copies
};

struct EvalResult {
  bool ran = false;  // some eval row had labelled tokens (a non-finite loss is then the model's, not "no eval")
  double loss = NAN, exact_match = NAN;
  std::size_t em_samples = 0;
  std::vector<std::string> examples;
};

class Loop;

// The step as the executor runs it (axengine/executor.hpp): Loop::device_step.
class LoopStep final : public StepProgram {
 public:
  explicit LoopStep(Loop& loop) : loop_(loop) {}
  at::Tensor run(const std::vector<Batch>& batches, double lr, const at::Tensor& lr_device) override;
  bool device_lr() const override;
  void abandon() override;

 private:
  Loop& loop_;
};

class Loop {
 public:
  explicit Loop(TrainerSetup& s) : s_(s), out_dir_(s.config->run.output_dir), clock_(s.checkpoint.every_minutes) {}

  TrainSummary run();

 private:
  void build_optimizer();
  void plan();
  void maybe_resume();
  PendingStep train_step(int64_t step);
  PendingStep stream_step(PendingStep p);
  void start_stream();
  PendingStep enqueue(PendingStep p, const std::vector<Batch>& batches);
  friend class LoopStep;
  at::Tensor device_step(const std::vector<Batch>& batches, double lr, const at::Tensor& lr_device);
  void choose_executor();
  at::Tensor grad_norm() const;
  void finish_steps(std::size_t keep);
  void record(const PendingStep& p);
  EvalResult evaluate();
  std::string save(int64_t step);
  void eval_and_log(int64_t step);
  void log_record(nlohmann::json record);
  void write_records();
  std::array<double, kFlags> local_flags() const;
  Requests requests() const;
  [[noreturn]] void stop_at(int64_t step, const Requests& r);
  std::vector<std::pair<std::string, std::string>> summary_rows(bool final) const;
  [[noreturn]] void non_finite(const std::string& what, int64_t step);
  void profile_before(int64_t step);
  void profile_after(int64_t step);
  void reduce_gradients();
  int64_t rank() const { return s_.group ? s_.group->rank() : 0; }
  int64_t world() const { return s_.group ? s_.group->world() : 1; }
  // The data-parallel view: context-parallel groups of consecutive ranks train the same rows (dist_context.hpp).
  int64_t data_rank() const { return rank() / s_.context_parallel; }
  int64_t data_world() const { return world() / s_.context_parallel; }

  TrainerSetup& s_;
  bool writer_ = true;  // rank 0 (or no group): writes metrics, report, checkpoints, profile; prints progress
  std::string out_dir_;
  at::Device device_{at::kCPU};
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::unique_ptr<Optimizer> opt_;
  data::PackedRows train_rows_, eval_rows_;
  std::vector<int64_t> row_tokens_, row_trainable_;
  // Token accounting over the whole run, carried across resume (trainer_state.json).
  int64_t tokens_seen_ = 0, trainable_seen_ = 0;
  int64_t steps_per_epoch_ = 0, total_steps_ = 0, start_step_ = 0;
  Schedule schedule_;
  MetricsLog metrics_;
  std::optional<TensorBoardLog> tensorboard_;  // follows metrics_: started with the first step's record
  // metrics_.records[0, written_) are in metrics.jsonl and the events. Nothing is written before the first step
  // is recorded (an eval at step 0 waits in memory): a run that fails before it (a kernel refused at the first
  // forward) leaves output_dir as it found it, and its rerun is not refused as "not empty".
  std::size_t written_ = 0;
  bool outputs_open_ = false;
  std::string write_failed_;  // the first failed write of metrics.jsonl or the events: the run stops with a checkpoint
  SaveClock clock_;
  std::array<double, kFlags> agreed_{};  // with a group: the sums read so far (sticky until acted on)
  at::Tensor flags_dev_, flags_sum_;     // with a group: this rank's requests for the step enqueued, the sums
  std::unique_ptr<Progress> progress_;
  TrainSummary sum_;
  double best_eval_ = NAN, last_eval_ = NAN, last_em_ = NAN;
  double grad_norm_ = 0, lr_ = 0;
  std::string last_ckpt_;
  Clock::time_point t0_;
  Profiler profiler_;
  at::Tensor found_inf_;  // float scalar on the device: 1 from the first non-finite step on (skips every later step)
  // fp16: dynamic loss scaling (loss_scaler.hpp). A step whose gradients are not finite is skipped and the scale
  // backs off; found_inf_ then stays 0 (only a non-finite loss sets it).
  std::unique_ptr<LossScaler> scaler_;
  void start_loss_scaling();
  std::deque<PendingStep> pending_;
  std::size_t lag_ = 0;   // steps left unread behind the running one: 1 on CUDA, 0 on the CPU (nothing to overlap)
  Clock::time_point last_read_;
  double train_time_ = 0;
  int64_t tokens_timed_ = 0;
  std::unique_ptr<GradReducer> reducer_;    // with a group: the gradients' all-reduce, overlapped with backward
  std::unique_ptr<GradReducer> expert_reducer_;  // expert parallelism: the expert shards', over their replicas
  bool said_overlap_ = false;
  std::unique_ptr<StepExecutor> executor_;  // how a step runs (select_executor); chosen after plan()
  LoopStep program_{*this};
  int64_t span_capacity_ = 0;               // cu_seqlens spans a static-shape micro-batch is padded to
  StreamCursor stream_cursor_;              // a streamed run: the cursor after the last step taken (its checkpoint's)
  // Last, so that it is destroyed (its worker joined) first, on every exit path.
  std::unique_ptr<StreamPrefetcher> prefetch_;
};

at::Tensor LoopStep::run(const std::vector<Batch>& batches, double lr, const at::Tensor& lr_device) {
  return loop_.device_step(batches, lr, lr_device);
}
bool LoopStep::device_lr() const {
  auto* d = dynamic_cast<DeviceLrOptimizer*>(loop_.opt_.get());
  return d && d->device_lr_supported();
}

void LoopStep::abandon() { loop_.opt_->zero_grad(); }

void Loop::choose_executor() {
  ExecutorContext ctx;
  ctx.device = s_.device;
  ctx.registry = s_.registry;
  if (const auto& kernels = s_.kernels) ctx.resolutions = [kernels] { return kernels->resolutions(); };
  ctx.micro_batches = s_.train.grad_accum;
  ctx.rows = s_.train.micro_batch_size;
  ctx.sequence_len = s_.data_config.sequence_len;
  span_capacity_ = data::span_capacity(train_rows_.rows, s_.train.micro_batch_size);
  // Streamed rows are not known in advance: a row holds at most sequence_len samples (no padding span then).
  if (s_.data.stream) span_capacity_ = s_.train.micro_batch_size * s_.data_config.sequence_len;
  ctx.packed |= static_cast<bool>(s_.data.stream);
  ctx.span_capacity = span_capacity_;
  for (const auto& row : train_rows_.rows) ctx.packed |= row.size() > 1;
  executor_ = select_executor(*s_.registry, ctx);
  if (executor_->name() != "eager") log::info(ax::str("step executor: ", executor_->name()));
}

// [profile]: steps start_step .. start_step + steps - 1 run under the Kineto profiler.
void Loop::profile_before(int64_t step) {
  const ProfileConfig& p = s_.profile;
  if (writer_ && p.steps > 0 && step == p.start_step) profiler_.start(s_.device.is_cuda());
}

void Loop::profile_after(int64_t step) {
  const ProfileConfig& p = s_.profile;
  if (!profiler_.running() || (step + 1 < p.start_step + p.steps && step + 1 < total_steps_)) return;
  if (s_.device.is_cuda()) at::accelerator::synchronizeDevice(static_cast<c10::DeviceIndex>(s_.device.index));
  const std::string dir = out_dir_ + "/profile";
  fs::create_directories(dir);
  std::string summary = ax::str("steps ", p.start_step + 1, "..", step + 1, " ", profiler_.stop(dir + "/trace.json", static_cast<int>(p.top)));
  safetensors::write_file_atomic(dir + "/summary.txt", summary, "profile");
  if (progress_) progress_->message(summary);
  else log::info(summary);
}

void Loop::build_optimizer() {
  params_ = s_.model->trainable_parameters();
  if (params_.empty()) throw UsageError("the model has no trainable parameters (is [lora] configured?)");
  ParamGroup decay, no_decay;
  decay.weight_decay = s_.train.weight_decay;
  for (auto& [name, p] : params_) {
    if (!p.requires_grad()) p.requires_grad_(true);
    (exempt_from_weight_decay(name, p) ? no_decay : decay).params.push_back(p);
  }
  auto provider = s_.registry->get<OptimizerProvider>(ProviderKind::optimizer, s_.train.optimizer);
  if (!provider) {
    std::vector<std::string> names;
    for (const auto* p : s_.registry->list(ProviderKind::optimizer)) names.push_back(p->info.name);
    throw UsageError(ax::str(s_.config->file, ": train.optimizer \"", s_.train.optimizer, "\" is not registered (known: ", join(names, ", "), ")"));
  }
  opt_ = provider->create({decay, no_decay}, optimizer_options(*s_.config));
}

void Loop::plan() {
  const int64_t S = s_.data_config.sequence_len;
  StepPlan plan = plan_steps(s_.data, S, s_.train, static_cast<uint64_t>(s_.config->run.seed), data_world());
  train_rows_ = std::move(plan.train_rows);
  eval_rows_ = std::move(plan.eval_rows);
  steps_per_epoch_ = plan.steps_per_epoch;
  total_steps_ = plan.total_steps;
  if (s_.data.stream) {
    schedule_ = Schedule{s_.train.schedule, s_.train.lr, s_.train.warmup_steps, total_steps_, s_.train.min_lr_ratio};
    log::info(ax::str("training: streamed from ", s_.data.stream->stream().shards().size(), " shard(s), packed into rows of ", S,
                      " tokens as read; ", total_steps_, " steps; ", params_.size(), " trainable tensors"));
    return;
  }
  if (train_rows_.truncated) log::warn(ax::str(train_rows_.truncated, " training samples are longer than data.sequence_len = ", S, " and were cut"));
  for (const auto& row : train_rows_.rows) {
    int64_t n = 0, trainable = 0;
    for (auto i : row) {
      const Sample& smp = s_.data.train[i];
      const int64_t len = std::min<int64_t>(S, static_cast<int64_t>(smp.input_ids.size()));
      n += len;
      // The targets the loss sees: labelled positions after the sample's first token (never predicted).
      for (int64_t k = 1; k < len && k < static_cast<int64_t>(smp.labels.size()); ++k) trainable += smp.labels[k] != -100;
    }
    row_tokens_.push_back(n);
    row_trainable_.push_back(trainable);
  }
  schedule_ = Schedule{s_.train.schedule, s_.train.lr, s_.train.warmup_steps, total_steps_, s_.train.min_lr_ratio};
  log::info(ax::str("training: ", s_.data.train.size(), " samples packed into ", train_rows_.rows.size(), " rows of ", S,
                " tokens (", train_rows_.tokens, " tokens, ",
                static_cast<int>(100.0 * static_cast<double>(train_rows_.tokens) / static_cast<double>(train_rows_.rows.size() * S)),
                "% filled); ", steps_per_epoch_, " steps/epoch, ", total_steps_, " steps; ", params_.size(), " trainable tensors, ",
                [&] { int64_t n = 0; for (auto& [k, p] : params_) n += p.numel(); return n; }(), " parameters"));
}

void Loop::maybe_resume() {
  std::optional<LoadedCheckpoint> loaded =
      s_.resume_checkpoint ? s_.resume_checkpoint() : find_resume_checkpoint(s_.checkpoint, out_dir_);
  if (!loaded) {  // start afresh
    metrics_.records.clear();
    if (!writer_) return;
    std::error_code ec;
    fs::remove(fs::path(out_dir_) / "metrics.jsonl", ec);
    return;
  }
  LoadedCheckpoint& ck = *loaded;
  const std::string& dir = ck.dir;
  const TrainerState& st = ck.state;
  check_resume_fits(ck, steps_per_epoch_, total_steps_, s_.config->run.seed);
  if (s_.data.stream)  // continue at the checkpoint's row: nothing before it is read again
    resume_stream(*s_.data.stream, st.data_stream, s_.data_config.sequence_len,
                  s_.train.micro_batch_size * s_.train.grad_accum * data_world(), dir);
  else if (st.data_stream)
    throw UsageError(ax::str(dir, ": the checkpoint is a streamed run's (data_stream); this run's data is map-style"));
  if (st.total_steps != total_steps_)
    log::warn(ax::str("resume: the checkpoint's run had ", st.total_steps, " steps, this one ", total_steps_,
                      ": the learning-rate schedule changes"));
  at::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    auto it = ck.params.find(name);
    if (it == ck.params.end()) throw UsageError(ax::str(dir, ": trainer state lacks parameter '", name, "'"));
    if (!it->second.sizes().equals(p.sizes()))
      throw UsageError(ax::str(dir, ": parameter '", name, "' has shape ", it->second.sizes(), ", the model ", p.sizes()));
    p.copy_(it->second);
  }
  opt_->load_state_dict(ck.optimizer);
  if (scaler_ && st.loss_scale) scaler_->load(*st.loss_scale);
  else if (scaler_ && writer_) log::warn(ax::str("resume: ", dir, " holds no loss scale (not an fp16 run's): it starts again at ", scaler_->options().init_scale));
  else if (st.loss_scale && writer_) log::warn(ax::str("resume: ", dir, " is an fp16 run's; its loss scale is not used (this run is not fp16)"));
  if (auto it = ck.rng.find("cpu"); it != ck.rng.end()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(it->second);
  }
  if (auto it = ck.rng.find("cuda"); it != ck.rng.end() && device_.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device_);
    gen.set_state(it->second);
  }
  start_step_ = st.step;
  best_eval_ = st.best_eval_loss.value_or(NAN);
  if (st.tokens_seen) {
    tokens_seen_ = *st.tokens_seen;
    trainable_seen_ = *st.trainable_tokens_seen;
  } else if (writer_) {
    log::warn(ax::str("resume: ", dir, " predates token accounting: tokens_seen counts from step ", st.step, " on"));
  }
  last_ckpt_ = dir;
  if (!writer_) return;
  metrics_.load(out_dir_, start_step_);
  metrics_.rewrite(out_dir_);
  written_ = metrics_.records.size();
  log::info(ax::str("resumed from ", dir, " at step ", start_step_,
                    s_.data.stream ? ax::str(" (pass ", s_.data.stream->cursor().pass, " over the shards)")
                                   : ax::str(" (epoch ", start_step_ / steps_per_epoch_, ")")));
}

// Enqueues one optimizer step without waiting for the device: validation happened when the batches were
// built (on the host), the loss stays on the device, clipping and the non-finite skip are decided there.
PendingStep Loop::train_step(int64_t step) {
  RECORD_USER_SCOPE("axengine::step");
  PendingStep p;
  p.step = step;
  p.started = Clock::now();
  if (s_.data.stream) return stream_step(std::move(p));
  const uint64_t seed = static_cast<uint64_t>(s_.config->run.seed);
  const int64_t epoch = step / steps_per_epoch_, in_epoch = step % steps_per_epoch_;
  // The row order of an epoch is a pure function of (seed, epoch): the data cursor is just the step.
  auto order = data::permutation(train_rows_.rows.size(), data::mix_seed(seed, 0x5eed0000ULL + static_cast<uint64_t>(epoch)));
  const int64_t mb = s_.train.micro_batch_size, ga = s_.train.grad_accum;
  std::vector<Batch> batches;
  for (int64_t j = 0; j < ga; ++j) {
    // Global micro-batch g of the epoch: rank k trains g = (in_epoch * ga + j) * world + k, so a step takes the
    // same rows at every world size with the same micro_batch_size x grad_accum x world (resume-safe), and
    // world 1 is the single-process order.
    const int64_t g = (in_epoch * ga + j) * data_world() + data_rank();
    std::vector<uint32_t> rows;
    for (int64_t r = 0; r < mb; ++r) {
      uint32_t row = order[static_cast<std::size_t>(g * mb + r)];
      rows.push_back(row);
    }
    // The tokens of the step over all ranks, from the same deterministic order (no collective for it).
    for (int64_t k = 0; k < data_world(); ++k)
      for (int64_t r = 0; r < mb; ++r) {
        const uint32_t row = order[static_cast<std::size_t>(((in_epoch * ga + j) * data_world() + k) * mb + r)];
        p.tokens += row_tokens_[row];
        p.trainable += row_trainable_[row];
      }
    batches.push_back(data::make_batch(s_.data.train, train_rows_, rows, s_.data_config.sequence_len, s_.pad_id, s_.data.collator.get()));
    if (executor_->static_shapes()) data::pad_static(batches.back(), span_capacity_);
  }
  return enqueue(std::move(p), batches);
}

// A streamed run's steps from here to the end: read from the stream (stream_step.hpp), in stream order, and
// made into micro-batches, data.prefetch_steps ahead on a background thread (stream_prefetch.hpp). After the
// resume's seek: the feed is the worker's alone from now on.
void Loop::start_stream() {
  const int64_t mb = s_.train.micro_batch_size, ga = s_.train.grad_accum, S = s_.data_config.sequence_len;
  const int64_t w = data_world(), r = data_rank();
  const int32_t pad_id = s_.pad_id;
  const bool pad = executor_->static_shapes();
  const int64_t capacity = span_capacity_;
  data::StreamFeed* feed = s_.data.stream.get();
  const DatasetType* collator = s_.data.collator.get();
  stream_cursor_ = feed->cursor();
  // Several ranks: each decodes only the rows it trains (Sample::materialise); one rank keeps on_bad_row's
  // skip for rows whose pixels fail.
  feed->set_materialise_eagerly(w == 1);
  if (w > 1 && writer_)
    log::info(ax::str("streaming: each of the ", w, " ranks packs every row and materialises (decodes) only its own"));
  // By value: the worker touches no member of the loop.
  auto produce = [=] {
    StreamedStep st = read_streamed_step(*feed, mb, ga, w, r, S);
    std::vector<uint32_t> ids;
    for (int64_t k = 0; k < mb; ++k) ids.push_back(static_cast<uint32_t>(k));
    for (std::size_t j = 0; j < st.samples.size(); ++j) {
      st.batches.push_back(data::make_batch(st.samples[j], st.rows[j], ids, S, pad_id, collator));
      if (pad) data::pad_static(st.batches.back(), capacity);
    }
    return st;
  };
  prefetch_ = std::make_unique<StreamPrefetcher>(produce, total_steps_ - start_step_, s_.data_config.prefetch_steps);
}

PendingStep Loop::stream_step(PendingStep p) {
  StreamedStep st = prefetch_->next();
  p.tokens = st.tokens;
  p.trainable = st.trainable;
  p.pass = static_cast<int64_t>(st.pass);
  p.data_wait_s = prefetch_->last_wait_s();
  stream_cursor_ = st.next;
  return enqueue(std::move(p), st.batches);
}

PendingStep Loop::enqueue(PendingStep p, const std::vector<Batch>& batches) {
  const int64_t step = p.step;
  p.lr = schedule_.at(step);
  if (s_.group) {  // this rank's requests go with the step's all-reduce (device_step): a copy, no host sync
    const auto flags = local_flags();
    at::Tensor h = at::tensor(at::ArrayRef<double>(flags.data(), flags.size()), at::kDouble);
    flags_dev_.copy_(device_.is_cuda() ? h.pin_memory() : h, /*non_blocking=*/true);
  }
  at::Tensor stats = executor_->step(program_, batches, p.lr);
  if (stats.is_cpu()) {
    p.host = stats;
    if (s_.group) p.flags = flags_sum_.clone();
  } else {
    auto pinned = at::TensorOptions().dtype(at::kDouble).pinned_memory(true);
    p.host = at::empty(stats.sizes(), pinned);
    p.host.copy_(stats, /*non_blocking=*/true);
    if (s_.group) {
      p.flags = at::empty({kFlags}, pinned);
      p.flags.copy_(flags_sum_, /*non_blocking=*/true);
    }
    p.ready.emplace(device_.type());
    p.ready->record(at::accelerator::getCurrentStream(device_.index()));
  }
  crash_point("step", "enqueued");
  return p;
}

// The device work of a step (LoopStep::run): forward and backward of each micro-batch, the gradients' mean
// over the ranks, the non-finite flag, clipping, the optimizer step; returns [losses..., grad norm,
// found_inf] on the device. Nothing here reads the device from the host, so an executor may capture it in a
// CUDA graph (found_inf_ is updated in place for that: a replay must read and write the same flag).
at::Tensor Loop::device_step(const std::vector<Batch>& batches, double lr, const at::Tensor& lr_device) {
  const int64_t ga = static_cast<int64_t>(batches.size());
  std::vector<at::Tensor> losses;
  for (std::size_t j = 0; j < batches.size(); ++j) {
    const Batch& host_batch = batches[j];
    // The last micro-batch's backward all-reduces the gradients as they become final (dist_reducer.hpp).
    if (reducer_) reducer_->arm(j + 1 == batches.size());
    if (expert_reducer_) expert_reducer_->arm(j + 1 == batches.size());
    Batch b = host_batch.to(device_);
    RECORD_USER_SCOPE("axengine::forward_backward");
    ModelOutput out = s_.model->forward(b, /*want_logits=*/false);
    crash_point("step", "forward");
    losses.push_back(out.loss.detach().reshape({}));
    // Context parallelism: out.loss carries this rank's share's gradient; the reducer averages over the world,
    // N times the data-parallel ranks, so the share counts N times to leave the sum of the shares.
    at::Tensor mean_part = out.loss * (static_cast<double>(s_.context_parallel) / static_cast<double>(ga));
    (scaler_ ? scaler_->scale(mean_part) : mean_part).backward();
    crash_point("step", "backward");
  }
  at::NoGradGuard no_grad;
  at::Tensor loss_vec = at::stack(losses).to(at::kDouble);
  if (s_.group) {
    reduce_gradients();  // every rank then holds the same mean gradient: the norm and the clip are global
    // The step's losses: the mean over the ranks of each micro-batch's (what one process with
    // grad_accum x world micro-batches averages); with them, the ranks' requests (stop, save), summed.
    at::Tensor both = at::cat({loss_vec, flags_dev_});
    s_.group->all_reduce_sum(both);
    loss_vec = both.narrow(0, 0, ga) / static_cast<double>(world());
    flags_sum_.copy_(both.narrow(0, ga, kFlags));
  }
  // fp16: the gradients back to their true size, and whether this step's are finite (skip and back off if not).
  at::Tensor step_inf;
  if (scaler_) {
    std::vector<at::Tensor> grads;
    for (auto& [name, prm] : params_)
      if (prm.grad().defined()) grads.push_back(prm.mutable_grad());
    step_inf = scaler_->unscale(grads);
    // Expert parallelism: each rank holds other experts' gradients; the step is skipped everywhere or nowhere.
    if (s_.expert_group) {
      s_.expert_group->all_reduce_sum(step_inf);
      step_inf.clamp_max_(1);
    }
  }
  at::Tensor norm = grad_norm();  // fp32 scalar on the device
  // What stops the run: a non-finite loss, or (without loss scaling, which skips such steps) gradient norm.
  at::Tensor bad = scaler_ ? at::logical_not(at::isfinite(loss_vec).all()).to(at::kFloat)
                           : at::logical_not(at::logical_and(at::isfinite(loss_vec).all(), at::isfinite(norm))).to(at::kFloat);
  found_inf_.copy_(at::maximum(found_inf_, bad.to(found_inf_.device())));
  const at::Tensor skip = scaler_ ? at::maximum(found_inf_, step_inf) : found_inf_;
  if (s_.train.max_grad_norm > 0) {
    // Clipped to max_grad_norm when above it: the factor max / (norm + 1e-6) in double, applied in the
    // gradients' dtype (as a host scalar would be), 1 when the norm is within bounds.
    at::Tensor nd = norm.to(at::kDouble);
    at::Tensor coef = at::where(nd > s_.train.max_grad_norm, s_.train.max_grad_norm / (nd + 1e-6), at::ones_like(nd)).to(at::kFloat);
    std::vector<at::Tensor> grads;
    for (auto& [name, prm] : params_)
      if (prm.grad().defined()) grads.push_back(prm.mutable_grad());
    if (!grads.empty()) at::_foreach_mul_(grads, coef);
  }
  if (lr_device.defined()) dynamic_cast<DeviceLrOptimizer&>(*opt_).step_device_lr(lr_device, skip);
  else opt_->step(lr, skip);
  opt_->zero_grad();
  crash_point("step", "optimizer");
  at::Tensor stats = at::cat({loss_vec, norm.to(at::kDouble).reshape({1}), found_inf_.to(at::kDouble).reshape({1})});
  if (!scaler_) return stats;
  // [..., skipped, the scale this step ran with]: read before the update changes it.
  at::Tensor scaled = at::cat({stats, step_inf.to(at::kDouble).reshape({1}), scaler_->scale_tensor().to(at::kDouble).reshape({1})});
  scaler_->update(step_inf);
  return scaled;
}

// fp16 training: the loss scaler, once the parameters are known (they must be fp32 master weights, which
// GradScaler unscales; fp16 factors would also lose every update below their precision).
void Loop::start_loss_scaling() {
  if (!s_.loss_scaling) return;
  for (const auto& [name, p] : params_)
    if (p.scalar_type() != at::kFloat)
      throw UsageError(ax::str("fp16 training with loss scaling needs fp32 trainable parameters (master weights), but '", name,
                               "' is ", c10::toString(p.scalar_type()), " (lora.dtype = \"fp32\", the default)"));
  scaler_ = std::make_unique<LossScaler>(*s_.loss_scaling, device_);
  const LossScaleOptions& o = scaler_->options();
  log::info(ax::str("fp16: dynamic loss scaling (initial scale ", o.init_scale, ", x", o.growth_factor, " after ", o.growth_interval,
                    " finite steps, x", o.backoff_factor, " and the step skipped when gradients are not finite)"));
}

// Waits for the buckets the last backward started (and starts the rest). Said once: how many buckets
// overlapped with backward (the test of the overlap reads it).
void Loop::reduce_gradients() {
  RECORD_USER_SCOPE("axengine::all_reduce_gradients");
  reducer_->finish();
  if (expert_reducer_) {
    // An expert shard's gradient already sums every token of its expert-parallel group (the all-to-alls
    // brought them here); the mean over the world is the sum over the ranks holding the same experts / world,
    // and expert_reducer_ left the mean over those ranks.
    expert_reducer_->finish();
    std::vector<at::Tensor> expert_grads;
    for (auto& [name, p] : params_)
      if (is_expert_parameter(name)) expert_grads.push_back(p.mutable_grad());
    at::_foreach_mul_(expert_grads, static_cast<double>(s_.expert_replicas->world()) / static_cast<double>(world()));
  }
  if (!said_overlap_) {
    said_overlap_ = true;
    log::info(ax::str("distributed: gradient all-reduce: ", reducer_->launched_in_backward(), " of ", reducer_->buckets(),
                      " buckets started during backward"));
  }
}

// Global gradient norm (fp32 scalar, on the gradients' device); 0 when no parameter has a gradient.
at::Tensor Loop::grad_norm() const {
  std::vector<at::Tensor> grads, expert_grads;
  for (const auto& [name, p] : params_)
    if (p.grad().defined()) (s_.expert_group && is_expert_parameter(name) ? expert_grads : grads).push_back(p.grad().detach());
  if (s_.expert_group) {
    // Expert parallelism: this rank holds a shard of the expert gradients; the group's squares add up.
    at::Tensor sq = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
    for (const auto& g : expert_grads) sq = sq + g.to(at::kFloat).pow(2).sum();
    s_.expert_group->all_reduce_sum(sq);
    for (const auto& g : grads) sq = sq + g.to(at::kFloat).pow(2).sum();
    return sq.sqrt();
  }
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  std::vector<at::Tensor> norms;
  if (device_.is_cuda()) {
    norms = at::_foreach_norm(grads, 2, at::kFloat);  // one launch per dtype group, not one per parameter
  } else {
    for (const auto& g : grads) norms.push_back(g.to(at::kFloat).norm());
  }
  return at::stack(norms).norm();
}

// Reads (waiting where the device is not there yet) and logs the oldest enqueued steps until `keep` are left.
void Loop::finish_steps(std::size_t keep) {
  while (pending_.size() > keep) {
    PendingStep p = std::move(pending_.front());
    pending_.pop_front();
    if (p.ready) {
      RECORD_USER_SCOPE("axengine::read_step");
      p.ready->synchronize();
    }
    record(p);
  }
}

void Loop::record(const PendingStep& p) {
  const int64_t ga = s_.train.grad_accum;
  const double* h = p.host.data_ptr<double>();
  double loss_sum = 0;
  for (int64_t j = 0; j < ga; ++j) {
    if (!std::isfinite(h[j])) non_finite(ax::str("loss (", h[j], ") in micro-batch ", j + 1, "/", ga), p.step + 1);
    loss_sum += h[j];
  }
  const double norm = h[ga];
  // fp16 loss scaling: [..., skipped, scale]. A skipped step's gradients were not finite: no update, the scale backs off.
  const bool skipped = scaler_ && h[ga + 2] != 0;
  if ((!std::isfinite(norm) && !skipped) || h[ga + 1] != 0) non_finite(ax::str("gradient norm (", norm, ")"), p.step + 1);
  if (skipped) {
    const std::string line = ax::str("step ", p.step + 1, ": gradients not finite at loss scale ", h[ga + 3],
                                     " (fp16): optimizer step skipped, the scale backs off to ",
                                     h[ga + 3] * scaler_->options().backoff_factor);
    if (progress_) progress_->finish();  // the progress bar's line ends before the warning
    log::warn(line);
  }
  const double loss = loss_sum / static_cast<double>(ga);
  if (p.flags.defined()) {
    const double* f = p.flags.data_ptr<double>();
    for (int64_t i = 0; i < kFlags; ++i) agreed_[i] = std::max(agreed_[i], f[i]);
  }
  grad_norm_ = norm;
  lr_ = p.lr;
  // The step's time runs from when it was enqueued, or from when the previous one was read (it could not
  // start on the device before), to now that it is read.
  const auto now = Clock::now();
  train_time_ += std::chrono::duration<double>(now - std::max(p.started, last_read_)).count();
  last_read_ = now;
  tokens_timed_ += p.tokens;
  sum_.tokens += p.tokens;
  tokens_seen_ += p.tokens;
  trainable_seen_ += p.trainable;
  sum_.losses.push_back(loss);
  sum_.steps = p.step + 1;
  const int64_t step = p.step;
  double tps = train_time_ > 0 ? static_cast<double>(tokens_timed_) / train_time_ : 0;
  double eta = train_time_ / static_cast<double>(step + 1 - start_step_) * static_cast<double>(total_steps_ - step - 1);
  double epoch = p.pass >= 0 ? static_cast<double>(p.pass) : static_cast<double>(step + 1) / static_cast<double>(steps_per_epoch_);
  nlohmann::json rec{{"step", step + 1}, {"epoch", epoch}, {"loss", loss}, {"lr", lr_},
                     {"grad_norm", std::isfinite(grad_norm_) ? nlohmann::json(grad_norm_) : nlohmann::json()},
                     {"tokens", p.tokens}, {"trainable_tokens", p.trainable}, {"tokens_seen", tokens_seen_},
                     {"trainable_tokens_seen", trainable_seen_}, {"tokens_per_s", tps}, {"elapsed_s", seconds_since(t0_)},
                     {"peak_memory_bytes", static_cast<int64_t>(peak_memory(s_.device))}};
  if (p.data_wait_s >= 0) rec["data_wait_s"] = p.data_wait_s;  // streamed: the host's wait for the step's rows
  if (scaler_) {  // fp16: the scale this step ran with, and whether its update was skipped
    rec["loss_scale"] = h[ga + 3];
    rec["skipped"] = skipped;
  }
  log_record(std::move(rec));
  if (progress_) progress_->update(step + 1, epoch, loss, lr_, tps, eta);
  crash_point("step", "recorded");
}

// To metrics.jsonl and the TensorBoard events, stamped with the wall-clock time (Unix seconds): TensorBoard's
// time axis, kept in the record so a resumed run rewrites the events with their first times.
void Loop::log_record(nlohmann::json record) {
  if (!writer_) return;
  record["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const bool step_record = record.contains("loss");
  metrics_.records.push_back(std::move(record));
  if (step_record || outputs_open_) write_records();
}

// The records not yet on file, to metrics.jsonl and the events (opened with the first step's record). A write
// that fails leaves no torn record (append_record.hpp); it is said once, and the run stops with a checkpoint at
// the next step boundary, which rewrites metrics.jsonl whole from memory.
void Loop::write_records() {
  if (!write_failed_.empty()) return;
  try {
    if (!outputs_open_) {
      outputs_open_ = true;
      tensorboard_.emplace(out_dir_, std::vector<nlohmann::json>(metrics_.records.begin(), metrics_.records.begin() + written_),
                           s_.train.tensorboard);
    }
    for (; written_ < metrics_.records.size(); ++written_) {
      metrics_.append_to_file(out_dir_, metrics_.records[written_]);
      tensorboard_->append(metrics_.records[written_]);
    }
  } catch (const WriteError& e) {
    write_failed_ = e.what();
    log::warn(ax::str(write_failed_, ": stopping the run with a checkpoint at the end of this step"));
  }
}

// This rank's requests now: a stop signal received, a failed log write, a time-based save due (rank 0's clock).
std::array<double, kFlags> Loop::local_flags() const {
  std::array<double, kFlags> f{};
  const int sig = stop_signal();
  f[kSigInt] = sig == SIGINT;
  f[kSigTerm] = sig == SIGTERM;
  f[kSigUsr1] = sig == SIGUSR1;
  f[kWriteFailed] = !write_failed_.empty();
  f[kSaveDue] = writer_ && clock_.due();
  return f;
}

// What to do at this boundary: alone, this process's own requests; with a group, the sums every rank has read
// (a rank that got no signal itself stops on the others', with the code of the first of theirs).
Requests Loop::requests() const {
  const std::array<double, kFlags> f = s_.group ? agreed_ : local_flags();
  Requests r;
  for (auto [slot, sig] : {std::pair{kSigTerm, SIGTERM}, {kSigInt, SIGINT}, {kSigUsr1, SIGUSR1}})
    if (f[slot] > 0 && !r.signal) r.signal = sig;
  if (r.signal && stop_signal()) r.signal = stop_signal();
  r.write_failed = f[kWriteFailed] > 0;
  r.save_due = f[kSaveDue] > 0;
  return r;
}

// After the checkpoint of `step`: the run ends, as asked (a signal) or forced (a log that could not be written).
void Loop::stop_at(int64_t step, const Requests& r) {
  if (progress_) progress_->finish();
  if (r.write_failed)
    throw RuntimeError(ax::str(writer_ ? write_failed_ : std::string("rank 0 could not write metrics.jsonl or the TensorBoard events"),
                               "; stopped at step ", step, " with checkpoint ", last_ckpt_,
                               ": free space (or fix the error) and continue with --resume"));
  throw Interrupted(r.signal, ax::str("interrupted at step ", step, " by ", signal_name(r.signal), "; resume with --resume (checkpoint ",
                                      last_ckpt_, ")"));
}

void Loop::non_finite(const std::string& what, int64_t step) {
  if (progress_) progress_->finish();
  std::string ck = last_ckpt_.empty() ? std::string("none was written yet") : "the last good one is " + last_ckpt_ + " (left intact)";
  throw RuntimeError(ax::str("non-finite ", what, " at step ", step, ": training stopped, no checkpoint written for it; ", ck,
                         ". Lower train.lr, keep train.max_grad_norm > 0, or check the data."));
}

EvalResult Loop::evaluate() {
  EvalResult r;
  if (s_.data.eval.empty()) return r;
  at::NoGradGuard no_grad;
  s_.model->set_training(false);
  struct Restore {
    Model* m;
    ~Restore() { m->set_training(true); }
  } restore{s_.model};
  const int64_t S = s_.data_config.sequence_len, mb = s_.train.micro_batch_size;
  int64_t rows = static_cast<int64_t>(eval_rows_.rows.size());
  if (s_.eval.max_rows > 0) rows = std::min(rows, s_.eval.max_rows);
  double loss_sum = 0, weight = 0;
  for (int64_t b0 = 0; b0 < rows; b0 += mb) {
    std::vector<uint32_t> ids;
    for (int64_t r = b0; r < std::min(rows, b0 + mb); ++r) ids.push_back(static_cast<uint32_t>(r));
    Batch b = data::make_batch(s_.data.eval, eval_rows_, ids, S, s_.pad_id, s_.data.collator.get());
    double n = static_cast<double>(b.labels.ne(-100).sum().item<int64_t>());  // on the host
    if (n == 0) continue;
    ModelOutput out = s_.model->forward(b.to(device_), false);
    loss_sum += out.loss.item<double>() * n;
    weight += n;
  }
  if (weight > 0) {
    r.ran = true;
    r.loss = loss_sum / weight;
  }
  crash_point("eval", "loss");

  if (!s_.eval.exact_match) return r;
  if (!dynamic_cast<CausalLmDecode*>(s_.model)) {  // a plugin family without KV-cached decode
    static bool said = false;
    if (!std::exchange(said, true)) log::warn("eval.exact_match: the model family cannot generate (no CausalLmDecode); skipped");
    return r;
  }
  // Samples with a prompt (a loss-free prefix after which every token is labelled): prompt in, answer out.
  std::vector<std::vector<int32_t>> prompts, answers;
  std::vector<int64_t> max_new;
  // A vision-language family prefills each prompt with its sample's images (the extras its forward reads).
  const bool with_images = dynamic_cast<ImageDecode*>(s_.model) != nullptr;
  std::vector<DecodeImages> images;
  for (const auto& smp : s_.data.eval) {
    if (static_cast<int64_t>(prompts.size()) >= s_.eval.max_samples) break;
    std::size_t p = 0;
    while (p < smp.labels.size() && smp.labels[p] == -100) ++p;
    if (p == 0 || p == smp.labels.size()) continue;
    bool answer_all_labelled = true;
    for (std::size_t k = p; k < smp.labels.size(); ++k) answer_all_labelled &= smp.labels[k] != -100;
    int64_t n = static_cast<int64_t>(smp.labels.size() - p);
    if (!answer_all_labelled || n > s_.eval.max_new_tokens || static_cast<int64_t>(smp.input_ids.size()) > S) continue;
    prompts.emplace_back(smp.input_ids.begin(), smp.input_ids.begin() + static_cast<std::ptrdiff_t>(p));
    answers.emplace_back(smp.input_ids.begin() + static_cast<std::ptrdiff_t>(p), smp.input_ids.end());
    max_new.push_back(n);
    if (with_images) images.push_back(smp.extras);
  }
  if (prompts.empty()) return r;
  std::vector<std::vector<int32_t>> got;
  try {
    got = generate_greedy(*s_.model, prompts, max_new, s_.eos_id, images);
  } catch (const UsageError& e) {
    if (!with_images) throw;
    // Samples whose images the decode cannot take (a dataset type whose extras the family does not read).
    static bool said = false;
    if (!std::exchange(said, true)) log::warn(str("eval.exact_match: skipped: ", e.what()));
    return r;
  }
  std::size_t right = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    bool ok = got[i] == answers[i];
    right += ok;
    if (static_cast<int64_t>(r.examples.size()) < s_.eval.show_examples && s_.decode)
      r.examples.push_back(ax::str("  ", ok ? "ok " : "bad", "  ", s_.decode(prompts[i]), " -> ", s_.decode(got[i]),
                               ok ? std::string() : ax::str("   (want ", s_.decode(answers[i]), ")")));
  }
  r.em_samples = got.size();
  r.exact_match = static_cast<double>(right) / static_cast<double>(got.size());
  return r;
}

void Loop::eval_and_log(int64_t step) {
  // Rank 0 alone: the others go on to the next step's all-reduce and wait there (within timeout_s). Under
  // expert parallelism every rank runs the forward passes (the experts are spread over them) and drops the result.
  if (!writer_) {
    if (s_.expert_group || s_.every_rank_evaluates) evaluate();
    return;
  }
  auto t = Clock::now();
  EvalResult r = evaluate();
  if (!r.ran && std::isnan(r.exact_match)) return;
  last_eval_ = r.loss;
  last_em_ = r.exact_match;
  if (std::isfinite(r.loss) && !(r.loss >= best_eval_)) best_eval_ = r.loss;
  // JSON has no NaN or infinity: a non-finite loss is recorded as null, and said so.
  nlohmann::json rec{{"step", step}, {"eval_loss", std::isfinite(r.loss) ? nlohmann::json(r.loss) : nlohmann::json()}};
  std::string line = ax::str("eval @ step ", step, ": loss ", r.loss);
  if (r.ran && !std::isfinite(r.loss))
    log::warn(ax::str("eval @ step ", step, ": the eval loss is not finite (", r.loss,
                      "); recorded as null in metrics.jsonl, not counted as the best"));
  if (!std::isnan(r.exact_match)) {
    rec["exact_match"] = r.exact_match;
    rec["exact_match_samples"] = r.em_samples;
    line += ax::str(", exact match ", std::round(1000 * r.exact_match) / 10, "% of ", r.em_samples);
  }
  log_record(std::move(rec));
  line += ax::str(" (", std::round(seconds_since(t) * 10) / 10, " s)");
  for (const auto& e : r.examples) line += "\n" + e;
  if (progress_) progress_->message(line);
  else log::info(line);
}

std::vector<std::pair<std::string, std::string>> Loop::summary_rows(bool final) const {
  std::vector<std::pair<std::string, std::string>> rows;
  const Requests stop = requests();
  rows.emplace_back("status", final               ? "finished"
                              : stop.signal       ? ax::str("interrupted by ", signal_name(stop.signal), "; resume with --resume")
                              : stop.write_failed ? "stopped: a log could not be written; resume with --resume"
                                                  : "in progress");
  rows.emplace_back("steps", ax::str(sum_.steps, " / ", total_steps_));
  rows.emplace_back("device", ax::str(s_.device.arch_name(), s_.device.is_cuda() ? " (" + s_.device.name + ")" : ""));
  if (!sum_.losses.empty()) rows.emplace_back("final train loss", ax::str(sum_.losses.back()));
  if (std::isfinite(last_eval_)) rows.emplace_back("last eval loss", ax::str(last_eval_));
  if (std::isfinite(best_eval_)) rows.emplace_back("best eval loss", ax::str(best_eval_));
  if (!std::isnan(last_em_)) rows.emplace_back("exact match", ax::str(std::round(1000 * last_em_) / 10, " %"));
  double wall = seconds_since(t0_);
  rows.emplace_back("wall time (this process)", format_duration(wall));
  if (wall > 0) rows.emplace_back("tokens/s", format_rate(static_cast<double>(sum_.tokens) / wall));
  rows.emplace_back("tokens seen", ax::str(tokens_seen_, " (", trainable_seen_, " trainable)"));
  rows.emplace_back(s_.device.is_cuda() ? "peak CUDA memory" : "peak RSS", format_bytes(peak_memory(s_.device)));
  rows.emplace_back("lr / schedule", ax::str(s_.train.lr, " ", s_.train.schedule, ", warmup ", s_.train.warmup_steps));
  rows.emplace_back("batch", ax::str(s_.train.micro_batch_size, " x ", s_.data_config.sequence_len, " tokens x ", s_.train.grad_accum, " accum"));
  if (!last_ckpt_.empty()) rows.emplace_back("last checkpoint", last_ckpt_);
  return rows;
}

// False when a floating-point tensor holds a NaN or an infinity.
bool all_finite(const at::Tensor& t) {
  return !t.defined() || !at::isFloatingType(t.scalar_type()) || at::isfinite(t).all().item<bool>();
}

std::string Loop::save(int64_t step) {
  CheckpointPayload pl;
  // A checkpoint is trusted as "the last good one" later: nothing non-finite goes into it.
  for (const auto& [name, p] : params_)
    if (!all_finite(p)) non_finite(ax::str("trainable parameter '", name, "'"), step);
  pl.params = params_;
  pl.optimizer = opt_->state_dict();
  for (const auto& [name, t] : pl.optimizer)
    if (!all_finite(t)) non_finite(ax::str("optimizer state '", name, "'"), step);
  pl.rng["cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  if (device_.is_cuda()) pl.rng["cuda"] = at::globalContext().defaultGenerator(device_).get_state();
  pl.state.step = step;
  pl.state.epoch = step / steps_per_epoch_;
  pl.state.step_in_epoch = step % steps_per_epoch_;
  pl.state.steps_per_epoch = steps_per_epoch_;
  pl.state.total_steps = total_steps_;
  pl.state.seed = s_.config->run.seed;
  pl.state.lr_next = schedule_.at(step);
  if (std::isfinite(best_eval_)) pl.state.best_eval_loss = best_eval_;
  pl.state.config = s_.config->file;
  pl.state.tokens_seen = tokens_seen_;
  pl.state.trainable_tokens_seen = trainable_seen_;
  if (scaler_) pl.state.loss_scale = scaler_->state();
  if (s_.data.stream)
    pl.state.data_stream = stream_state(stream_cursor_, s_.data_config.sequence_len,
                                        s_.train.micro_batch_size * s_.train.grad_accum * data_world());
  pl.write_adapter = s_.write_adapter;
  // Ranks hold the same parameters and optimizer state (same mean gradient every step): rank 0 writes them,
  // after a barrier (every rank finished the step), and the others wait until the checkpoint is complete, so
  // none runs ahead of (or exits before) the last good one.
  if (s_.gather_adapter) s_.gather_adapter();  // expert parallelism: every rank sends its experts' LoRA
  if (s_.group) s_.group->barrier();
  if (writer_) {
    last_ckpt_ = save_checkpoint(out_dir_, step, pl, s_.checkpoint.keep_last);
    write_records();  // the events too (a resume that runs no step has not opened them yet)
    metrics_.rewrite(out_dir_);
    written_ = metrics_.records.size();
    write_report(out_dir_, metrics_, s_.title, summary_rows(step == total_steps_));
    if (progress_) progress_->message(ax::str("checkpoint ", last_ckpt_));
  }
  if (s_.group) s_.group->barrier();
  clock_.reset();
  agreed_[kSaveDue] = 0;
  return last_ckpt_;
}

TrainSummary Loop::run() {
  t0_ = Clock::now();
  device_ = s_.device.is_cuda() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(s_.device.index)) : at::Device(at::kCPU);
  fs::create_directories(out_dir_);
  if (int64_t threads = intra_op_threads(s_.train.cpu_threads); threads > 0) at::set_num_threads(static_cast<int>(threads));
  at::manual_seed(static_cast<uint64_t>(s_.config->run.seed));
  if (s_.device.is_cuda()) c10::getDeviceAllocator(at::kCUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(s_.device.index));
  writer_ = rank() == 0;
  build_optimizer();
  start_loss_scaling();
  plan();
  choose_executor();
  maybe_resume();
  if (s_.data.stream) start_stream();
  if (s_.group) {
    // One starting point whatever each rank's initialisation or resume read: rank 0's parameters and
    // optimizer state.
    std::map<std::string, at::Tensor> opt_state = opt_->state_dict();  // a plugin's may be copies: loaded back
    std::vector<at::Tensor> state, expert_state;
    for (auto& [name, p] : params_) (s_.expert_group && is_expert_parameter(name) ? expert_state : state).push_back(p.detach());
    // Expert parallelism starts fresh only (plan_run refuses a resume): every rank's optimizer state is the
    // initial one, and its optimizer keys do not say which entries belong to an expert shard.
    if (!s_.expert_group)
      for (auto& [name, t] : opt_state)
        if (t.defined()) state.push_back(t);
    s_.group->broadcast_from_0(state, static_cast<int64_t>(s_.bucket_mb * 1024 * 1024));
    if (!expert_state.empty()) s_.expert_replicas->broadcast_from_0(expert_state, static_cast<int64_t>(s_.bucket_mb * 1024 * 1024));
    opt_->load_state_dict(opt_state);
    // Replicated parameters are averaged over the world; expert shards (expert parallelism) over the ranks
    // that hold the same experts (reduce_gradients rescales those to the world's mean).
    std::vector<at::Tensor> params, expert_params;
    for (auto& [name, p] : params_) (s_.expert_group && is_expert_parameter(name) ? expert_params : params).push_back(p);
    const auto bucket = static_cast<int64_t>(s_.bucket_mb * 1024 * 1024);
    reducer_ = std::make_unique<GradReducer>(*s_.group, std::move(params), bucket);
    if (!expert_params.empty()) expert_reducer_ = std::make_unique<GradReducer>(*s_.expert_replicas, std::move(expert_params), bucket);
  }
  sum_.first_step = start_step_;
  sum_.steps = start_step_;
  if (writer_) progress_ = std::make_unique<Progress>(total_steps_, s_.train.log_every);
  s_.model->set_training(true);
  if (start_step_ == 0 && s_.eval.every_steps > 0) eval_and_log(0);

  found_inf_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  if (s_.group) {
    flags_dev_ = at::zeros({kFlags}, at::TensorOptions().dtype(at::kDouble).device(device_));
    flags_sum_ = at::zeros({kFlags}, at::TensorOptions().dtype(at::kDouble).device(device_));
  }
  lag_ = device_.is_cuda() ? 1 : 0;
  // From here a stop signal is a request (stop_signal.hpp): acted on at the next step boundary. Before, it ends
  // the process as usual: there is nothing to save yet.
  StopSignals stop_signals;
  clock_.reset();
  for (int64_t step = start_step_; step < total_steps_; ++step) {
    profile_before(step);
    try {
      pending_.push_back(train_step(step));
    } catch (...) {
      // The steps before this one are done: on CUDA the last of them is still pending (read one step late,
      // lag_), and its metrics line must not be lost with the error (a bad streamed row stops the run at its
      // step, with the steps before it on record). A second failure while reading it leaves the first to report.
      try {
        finish_steps(0);
      } catch (...) {
      }
      throw;
    }
    profile_after(step);
    finish_steps(lag_);
    clock_.step_done();
    // Every rank takes the same branches here: the schedule is the step's, the requests the ranks' sums.
    const Requests req = requests();
    bool last = step + 1 == total_steps_;
    bool eval_now = s_.eval.every_steps > 0 && (step + 1) % s_.eval.every_steps == 0 && !last;
    bool save_now = ((s_.checkpoint.every_steps > 0 && (step + 1) % s_.checkpoint.every_steps == 0) || req.save_due || req.stop()) && !last;
    if (eval_now || save_now || last) finish_steps(0);  // both read the parameters of this very step
    // A stop keeps this step's eval (the resumed run starts after it and would not redo it).
    if (eval_now) eval_and_log(step + 1);
    if (save_now) save(step + 1);
    if (req.stop() && !last) stop_at(step + 1, req);
    crash_point("step", "boundary");
  }
  finish_steps(0);
  if (sum_.steps > start_step_ || last_ckpt_.empty()) eval_and_log(total_steps_);
  if (progress_) progress_->finish();
  sum_.last_checkpoint = save(total_steps_);
  if (const Requests r = requests(); r.write_failed) stop_at(total_steps_, r);
  if (stop_signal()) log::warn(ax::str(signal_name(stop_signal()), " came during the last step: the run finished at step ", total_steps_));
  progress_.reset();
  sum_.wall_s = seconds_since(t0_);
  sum_.tokens_per_s = train_time_ > 0 ? static_cast<double>(tokens_timed_) / train_time_ : 0;
  sum_.peak_memory_bytes = peak_memory(s_.device);
  sum_.final_loss = sum_.losses.empty() ? NAN : sum_.losses.back();
  sum_.final_eval_loss = last_eval_;
  sum_.best_eval_loss = best_eval_;
  sum_.exact_match = last_em_;
  return sum_;
}

}  // namespace

TrainSummary run_trainer(TrainerSetup& setup) {
  if (!setup.config || !setup.registry || !setup.model) throw RuntimeError("run_trainer: incomplete setup");
  Loop loop(setup);
  return loop.run();
}

}  // namespace ax::train
