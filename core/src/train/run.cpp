// train_from_config / prepare_from_config: an Engine (config, device, registry, kernels) in, a trained
// adapter, checkpoints, metrics.jsonl and report.html out.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

#include "axengine/dir_lock.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/hub_cache.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/strings.hpp"
#include "axengine/training.hpp"
#include "axengine/version.hpp"
#include "data/chat_template.hpp"
#include "data/prepare.hpp"
#include "models/decoder.hpp"
#include "models/offload.hpp"
#include "models/tiled_mlp.hpp"
#include "models/training_record.hpp"
#include "train/dist_config.hpp"
#include "train/dist_context.hpp"
#include "train/dist_expert.hpp"
#include "train/dist_group.hpp"
#include "train/dist_shard_base.hpp"
#include "train/generate_io.hpp"
#include "train/progress.hpp"
#include "train/run_check.hpp"
#include "train/trainer.hpp"

namespace ax {
namespace {

std::unique_ptr<Tokenizer> tokenizer_for(const RunConfig& cfg) {
  if (cfg.model.path.empty()) throw UsageError(ax::str(cfg.file, ": [model] path is required (a Hugging Face model directory)"));
  return load_hf_tokenizer(hub::require_model_dir(cfg.model.path, cfg.dir));  // a hub ID not in the cache: say where it was looked for
}

// A path as a shell word: quoted when it holds anything a shell would split or expand.
std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./@=:+-") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// How to call this axengine again: "axengine" where PATH has one (the pip package's console script), else this
// executable's path (scripts/quickstart.sh runs build/bin/axengine).
std::string self_command() {
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "";
  for (std::size_t b = 0; b <= path.size();) {
    const std::size_t e = std::min(path.find(':', b), path.size());
    if (e > b && ::access((path.substr(b, e - b) + "/axengine").c_str(), X_OK) == 0) return "axengine";
    b = e + 1;
  }
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "axengine";
}

bool has_chat_template(const std::string& model_dir) {
  try {
    train::ChatPrompt::load(model_dir);
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

// The summary's last line: where the adapter is and the commands that use it, ready to paste (a hub-cache base
// by its ID, as the user named it). A model without a chat template cannot chat: `generate` answers prompts.
std::string next_steps(const RunConfig& cfg, const std::string& adapter) {
  std::string model = hub::repo_id_of_snapshot(cfg.model.path);
  if (model.empty()) model = cfg.model.path;
  const std::string out = cfg.run.output_dir, ax = shell_word(self_command());
  const std::string use = has_chat_template(cfg.model.path)
                              ? ax::str("chat: ", ax, " chat --model ", shell_word(model), " --adapter ", shell_word(adapter))
                              : ax::str("prompt it (no chat template for chat): ", ax, " generate --model ", shell_word(model),
                                        " --adapter ", shell_word(adapter), " --input PROMPTS.jsonl --output ANSWERS.jsonl",
                                        " (rows {\"prompt\": \"...\"})");
  return ax::str("  next            adapter ", shell_word(adapter), "; ", use, "; merge: ", ax, " merge-lora --config ",
                 shell_word(cfg.file), " --adapter ", shell_word(adapter), " --out ", shell_word(out + "/merged"),
                 "; report: xdg-open ", shell_word(out + "/report.html"));
}

std::string fmt(double v, int prec = 4) {
  if (std::isnan(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

models::TrainingRecord training_record(const Engine& engine, const WeightPolicy& weights, const std::string& base_format) {
  const RunConfig& cfg = engine.config;
  models::TrainingRecord r;
  std::error_code ec;
  r.base_model = std::filesystem::absolute(cfg.model.path, ec).lexically_normal().string();
  r.weights = weights;
  r.base_format = base_format;
  r.dtype = engine.dtype;
  for (const auto& kw : data::chat_template_kwargs(cfg)) r.template_kwargs.emplace_back(kw);
  r.run_config = cfg.file.empty() ? std::string() : std::filesystem::absolute(cfg.file, ec).lexically_normal().string();
  r.axengine_version = kVersion;
  return r;
}

}  // namespace

std::vector<std::string> run_output_names() { return {"checkpoints", "metrics.jsonl", "report.html", "profile"}; }

void prepare_from_config(Engine& engine) {
  auto tok = tokenizer_for(engine.config);
  auto dc = data::read_data_config(engine.config);
  // One prepare at a time in a cache dir (runs reading and adding to it need no lock: each cache file is
  // written to a temp file of its own and renamed).
  std::optional<DirLock> lock;
  if (dc.cache) lock.emplace((std::filesystem::path(dc.cache_dir) / kDirLockFile).string(), ax::str("data.cache_dir ", dc.cache_dir));
  auto prepared = data::prepare_datasets(engine.config, dc, engine.registry, *tok, train::model_vocab_size(engine.config.model.path),
                                         model_image_processor(engine.config.model.path));
  log::info(data::describe(prepared));
  for (const auto& s : prepared.sources)
    if (!s.cache_file.empty()) log::info(ax::str("  cache: ", s.cache_file));
}

std::vector<std::string> check_run(const Engine& engine, const TrainOptions& options) {
  return train::describe_plan(engine, train::plan_run(engine, options));
}

std::string explain_kernels(const Engine& engine) {
  if (engine.config.model.path.empty()) return format_resolution_table(engine.resolve_all(), engine.device);
  const ModelLoadOptions o = train::model_load_options(engine, train::read_lora_config(engine.config), train::read_train_config(engine.config));
  return format_resolution_table(train::kernel_plan(engine, train::check_run_model(engine, o)), engine.device);
}

// Started by a launcher (torchrun, axengine launch; dist_config.hpp): this process joins the group as rank
// RANK, on GPU LOCAL_RANK.
std::unique_ptr<train::DistGroup> join_group(Engine& engine) {
  const train::DistEnv env = train::read_dist_env();
  if (!env.launched) return nullptr;
  if (engine.device.is_cuda() && at::hasCUDA()) {
    const auto count = static_cast<int64_t>(at::accelerator::deviceCount());
    if (env.local_rank >= count)
      throw UsageError(ax::str("LOCAL_RANK=", env.local_rank, " but this machine has ", count,
                               " CUDA devices: start at most that many ranks a node"));
    engine.device.index = static_cast<int>(env.local_rank);
    at::accelerator::setDeviceIndex(static_cast<c10::DeviceIndex>(env.local_rank));
  }
  return train::DistGroup::join(env, train::read_distributed_config(engine.config), engine.device);
}

void train_from_config(Engine& engine, const TrainOptions& options) {
  const RunConfig& cfg = engine.config;
  auto group = join_group(engine);
  const bool writer = !group || group->rank() == 0;

  // Everything validate checks, before any weight is loaded; then nothing it found is read again. Rank 0
  // plans first (it tokenises into the prepared-data cache; the others then read it) and the others before
  // rank 0 writes anything (the output_dir check would see its files).
  if (group && !writer) group->barrier();
  train::RunPlan plan = train::plan_run(engine, options);
  if (group && writer) group->barrier();
  if (group) group->barrier();
  if (writer) std::cout << format_resolution_table(plan.backends, engine.device) << std::flush;  // the model's calls
  log::info(data::describe(plan.data));
  if (plan.device_problem) throw UsageError(*plan.device_problem);
  // One writer per output_dir, from before anything is written into it (--overwrite's removal included) to the
  // end: a second run, --resume or --overwrite started meanwhile is refused naming this process.
  std::optional<DirLock> lock;
  if (writer)
    lock.emplace((std::filesystem::path(cfg.run.output_dir) / kDirLockFile).string(), ax::str("run.output_dir ", cfg.run.output_dir));
  if (options.overwrite && writer) {  // only what a run writes: anything else the person keeps in output_dir stays
    for (const auto& name : run_output_names()) {
      const std::filesystem::path p = std::filesystem::path(cfg.run.output_dir) / name;
      if (std::filesystem::exists(p)) log::info(ax::str("--overwrite: removing ", p.string()));
      std::filesystem::remove_all(p);
    }
  }
  if (group && options.overwrite) group->barrier();  // removed before any rank resumes or writes

  train::TrainerSetup s;
  s.config = &cfg;
  s.registry = &engine.registry;
  s.device = engine.device;
  s.data_config = plan.data_config;
  s.train = plan.train;
  s.checkpoint = plan.checkpoint;
  s.eval = plan.eval;
  s.profile = plan.profile;
  s.data = std::move(plan.data);
  s.resume_checkpoint = [&plan] { return std::move(plan.resume); };

  // Expert parallelism: its sub groups (every rank, before the model: the load reads this rank's experts only).
  train::ExpertParallelGroups ep;
  if (group && plan.distributed.expert_parallel > 1) {
    ep = train::make_expert_parallel(*group, plan.distributed.expert_parallel);
    plan.model.expert_parallel = ep.comm;
  }
  // Context parallelism: its groups (every rank, together; the model takes them once loaded).
  train::ContextParallelGroups cp;
  if (group && plan.distributed.context_parallel > 1) cp = train::make_context_parallel(*group, plan.distributed.context_parallel);
  // shard_base: every layer's frozen tensors cut over the ranks while loading (once read and quantised, layer
  // by layer), gathered per layer. A family with layers of its own (qwen2_5_vl, plugins) is refused unread.
  const bool sharded = group && plan.distributed.shard_base;
  auto model = sharded ? train::load_sharded_model(*group, engine.registry, plan.model,
                                                   ax::str(cfg.file, ": [distributed] shard_base: the ", plan.model_check.family,
                                                           " model family does not gather its layers per use"))
                       : load_model(engine.registry, plan.model);
  if (!plan.train.unfrozen_parameters.empty()) {  // plan_run resolved them on a built-in decoder family
    auto* decoder = dynamic_cast<models::DecoderModel*>(model.get());
    if (!decoder)
      throw UsageError(ax::str(cfg.file, ": train.unfrozen_parameters: the ", plan.model_check.family,
                               " model family trains LoRA adapters only"));
    const auto compute = ops::parse_dtype(engine.dtype);
    decoder->unfreeze(plan.train.unfrozen_parameters, plan.lora.spec.dtype == "compute" && compute ? *compute : at::kFloat,
                      plan.model.dir);
  }
  auto& tok = plan.tokenizer;
  s.model = model.get();
  s.kernels = plan.model.kernels;
  s.eos_id = tok->eos_id();
  s.pad_id = tok->pad_id() >= 0 ? tok->pad_id() : (tok->eos_id() >= 0 ? tok->eos_id() : 0);
  // Every checkpoint's adapter carries what it was trained with (merge-lora rebuilds that base, generate
  // prompts as the data was rendered).
  const models::TrainingRecord record = training_record(engine, plan.model.weights, model->weight_stats().format);
  s.write_adapter = [&model, &record](const std::string& dir) {
    model->save_adapter(dir);
    models::write_training_record(dir, record);
  };
  s.decode = [&tok](const std::vector<int32_t>& ids) { return tok->decode(ids, true); };
  s.title = ax::str("axengine: ", cfg.file);
  s.group = group.get();
  s.bucket_mb = plan.distributed.bucket_mb;
  s.every_rank_evaluates = sharded;
  if (engine.dtype == "fp16") s.loss_scaling = train::LossScaleOptions{};  // GradScaler's defaults (docs/training.md)
  if (ep.comm) {
    auto* decoder = dynamic_cast<models::DecoderModel*>(model.get());
    if (!decoder || !decoder->expert_parallel())  // a plugin family that does not take expert_parallel
      throw UsageError(ax::str(cfg.file, ": [distributed] expert_parallel: the ", plan.model_check.family,
                               " model family does not spread its experts over ranks"));
    s.expert_group = ep.experts.get();
    s.expert_replicas = ep.replicas.get();
    s.gather_adapter = [decoder] { decoder->gather_expert_lora(); };
  }

  if (cp.comm) {
    auto* decoder = dynamic_cast<models::DecoderModel*>(model.get());
    if (!decoder)  // a plugin family (check_context_parallel refuses the built-in ones that cannot split)
      throw UsageError(ax::str(cfg.file, ": [distributed] context_parallel: the ", plan.model_check.family,
                               " model family does not split its rows over ranks"));
    decoder->set_context_parallel(cp.comm);
    s.context_parallel = plan.distributed.context_parallel;
    s.every_rank_evaluates = true;  // an evaluation's forward gathers from the whole group
  }

  // [train] activation_offload: where each checkpointed layer keeps its input (models/offload.hpp), for this run.
  const autograd::CheckpointStoreScope store(plan.train.activation_offload ? autograd::CheckpointStore::kHost
                                                                           : autograd::CheckpointStore::kDevice);
  const models::MlpTilesScope tiles(plan.train.tiled_mlp);  // [train] tiled_mlp (models/tiled_mlp.hpp)
  auto sum = train::run_trainer(s);
  if (!writer) return;
  std::vector<std::string> lines{
      ax::str("done: ", sum.steps, " steps", sum.first_step ? ax::str(" (resumed at ", sum.first_step, ")") : std::string(), " in ",
          train::format_duration(sum.wall_s)),
      ax::str("  tokens/s        ", train::format_rate(sum.tokens_per_s), " (", sum.tokens, group ? " tokens trained by all ranks)" : " tokens trained by this process)"),
      ax::str("  peak memory     ", train::format_bytes(sum.peak_memory_bytes), engine.device.is_cuda() ? " (CUDA allocator)" : " (RSS)"),
      ax::str("  train loss      ", sum.losses.empty() ? "n/a" : fmt(sum.losses.front()) + " -> " + fmt(sum.final_loss)),
      ax::str("  eval loss       ", fmt(sum.final_eval_loss), " (best ", fmt(sum.best_eval_loss), ")")};
  const WeightStats ws = model->weight_stats();
  lines.push_back(ax::str("  base weights    ", ws.format, ": ", train::format_bytes(double(ws.bytes)), " resident (",
                          ws.bytes, " bytes), peak ", train::format_bytes(double(ws.peak_bytes)), " (", ws.peak_bytes,
                          " bytes) while loading",
                          ws.packed_params ? ax::str("; ", ws.packed_params, " of ", ws.params, " parameters packed at ",
                                                     fmt(double(ws.packed_bytes) / double(ws.packed_params), 3), " bytes/param")
                                           : std::string()));
  if (!std::isnan(sum.exact_match)) lines.push_back(ax::str("  exact match     ", fmt(100 * sum.exact_match, 1), " %"));
  lines.push_back(ax::str("  adapter         ", sum.last_checkpoint, " (PEFT format)"));
  lines.push_back(ax::str("  report          ", cfg.run.output_dir, "/report.html, metrics.jsonl"));
  if (s.train.tensorboard) lines.push_back(ax::str("  tensorboard     tensorboard --logdir ", cfg.run.output_dir));
  lines.push_back(next_steps(cfg, sum.last_checkpoint));
  log::info(join(lines, "\n"));
}

}  // namespace ax
