#include "train/run_check.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "axengine/dataset.hpp"
#include "axengine/dir_lock.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/hub_cache.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/linear_ce.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "data/entry.hpp"
#include "data/jsonl.hpp"
#include "models/hf_config.hpp"
#include "train/dist_context.hpp"
#include "train/dist_expert.hpp"
#include "train/dist_shard_base.hpp"
#include "train/memory_estimate.hpp"
#include "train/progress.hpp"
#include "device_probe.hpp"

namespace fs = std::filesystem;

namespace ax::train {
namespace {

const toml::node* node_at(const RunConfig& cfg, const std::string& path) { return cfg.document.at_path(path).node(); }

// [model] path: the directory must exist before anything is read from it.
void check_model_path(const RunConfig& cfg) {
  if (cfg.model.path.empty())
    throw UsageError(ax::str(cfg.file, ": [model] path is required (a Hugging Face model directory)"));
  try {  // a directory, or a hub ID: complete in the hub cache (axengine/hub_cache.hpp)
    hub::require_model_dir(cfg.model.path, cfg.dir);
  } catch (const UsageError& e) {
    config_fail(cfg.file, node_at(cfg, "model.path"), ax::str("model.path: ", e.what()));
  }
}

// Every backend a [kernels] list names must be one that a built-in or a loaded plugin registers for that op:
// selection would otherwise skip the name without a word ("not registered"), and a typo would go unnoticed.
void check_kernel_lists(const Engine& engine) {
  const RunConfig& cfg = engine.config;
  auto check_list = [&](const std::string& table, const std::string& op_id, const std::vector<std::string>& names) {
    const OpInfo* op = find_op(op_id);
    const std::string key = op ? op->config_key : op_id;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (engine.registry.find(ProviderKind::kernel, op_id, names[i])) continue;
      std::vector<std::string> known;
      for (const Provider* p : engine.registry.list(ProviderKind::kernel, op_id)) known.push_back(p->info.name);
      std::sort(known.begin(), known.end());
      std::string why;
      for (const auto& r : engine.plugins->reports())
        if (r.status != PluginReport::Status::loaded && r.name == names[i])
          why = ax::str("; the plugin ", r.name, " at ", r.path, " was ", to_string(r.status), ": ", r.reason);
      std::string hint = closest(names[i], known);
      config_fail(cfg.file, node_at(cfg, ax::str(table, ".", key, "[", i, "]")),
                  ax::str(table, ".", key, " names backend \"", names[i], "\", which neither a built-in nor a loaded plugin provides for ",
                          op_id, " (provided: ", join(known, ", "), ")", why,
                          hint.empty() || !why.empty() ? std::string() : ax::str("; did you mean \"", hint, "\"?")));
    }
  };
  for (const auto& [op, names] : cfg.kernels.prefer) check_list("kernels", op, names);
  for (const auto& [arch, lists] : cfg.kernels.by_arch)
    for (const auto& [op, names] : lists) check_list(ax::str("kernels.arch.", arch_name(arch)), op, names);
}

// The [[datasets]] entries before anything is tokenised: each names a registered type and files that exist.
void check_dataset_entries(const Engine& engine) {
  const RunConfig& cfg = engine.config;
  auto entries = data::dataset_entries(cfg);
  if (entries.empty()) throw UsageError(ax::str(cfg.file, ": no [[datasets]] entry: nothing to train on"));
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const toml::table& entry = *entries[i];
    TableBinder t(&entry, "datasets", BindContext{cfg.file, nullptr});
    data::CommonEntry common;
    data::bind_common_entry(t, common);
    if (!engine.registry.get<DatasetType>(ProviderKind::dataset, common.type)) {
      std::vector<std::string> names;
      for (const auto* p : engine.registry.list(ProviderKind::dataset)) names.push_back(p->info.name);
      std::string hint = closest(common.type, names);
      config_fail(cfg.file, entry.get("type"),
                  ax::str("unknown dataset type \"", common.type, "\" (known: ", join(names, ", "), ")",
                          hint.empty() ? "" : ax::str("; did you mean \"", hint, "\"?")));
    }
    for (const char* key : {"path", "eval_path"}) {
      const std::string given = key == std::string("path") ? common.path : common.eval_path;
      if (given.empty()) continue;
      const std::string p = data::resolve_against(cfg.dir, given);
      std::error_code ec;
      std::vector<std::string> files{p};
      if (data::is_glob(p)) {
        try {
          files = data::expand_data_path(p);
        } catch (const UsageError&) {
          config_fail(cfg.file, entry.get(key), ax::str("datasets[", i, "].", key, ": no file matches ", p));
        }
      } else if (!fs::exists(p, ec)) {
        config_fail(cfg.file, entry.get(key), ax::str("datasets[", i, "].", key, ": ", p, " does not exist"));
      }
      for (const auto& f : files)  // before any weight is loaded, not when the data is prepared
        if (!data::parquet_supported() && data::needs_arrow(f))
          config_fail(cfg.file, entry.get(key), ax::str("datasets[", i, "].", key, ": ", f, " is Parquet or Arrow data, and this axengine was built without Arrow/Parquet support (see docs/datasets.md, \"Data files\")"));
    }
  }
}

void check_optimizer(const Engine& engine, const TrainConfig& train) {
  if (engine.registry.get<OptimizerProvider>(ProviderKind::optimizer, train.optimizer)) return;
  std::vector<std::string> names;
  for (const auto* p : engine.registry.list(ProviderKind::optimizer)) names.push_back(p->info.name);
  throw UsageError(ax::str(engine.config.file, ": train.optimizer \"", train.optimizer, "\" is not registered (known: ", join(names, ", "), ")"));
}

// The backend of every call the model makes (its plan: op, weight format, layout), as selection will pick it
// for this device and dtype. Nothing fitting is an error at start, strict or not (without strict, `reference`
// was tried and cannot serve the query either, e.g. a weight format it lacks).
std::vector<Resolution> check_backends(const Engine& engine, const ModelCheck& model) {
  std::vector<Resolution> out;
  for (auto& r : kernel_plan(engine, model)) {
    if (r.chosen.empty()) {
      std::vector<std::string> why;
      for (const auto& c : r.candidates) why.push_back(ax::str(c.backend, ": ", c.verdict));
      throw UsageError(ax::str(engine.config.file, ": ", engine.config.kernels.strict ? "kernels.strict: " : "", "no backend for ", r.op,
                               " (dtype ", r.query.dtype, r.query.format.empty() ? "" : ", format " + r.query.format, ") on ",
                               engine.device.arch_name(), " from ", r.list_source, " — ",
                               why.empty() ? std::string("the list is empty") : join(why, "; ")));
    }
    out.push_back(std::move(r));
  }
  return out;
}

// run.output_dir must be a directory the run can create and write: not empty, no NUL (the C APIs would cut the
// path there and write elsewhere), not an existing file, and under a writable, real filesystem (not /proc,
// /sys and the like, where mkdir fails or writes mean something else). Checked on its nearest existing
// ancestor, without creating anything.
void check_output_dir_usable(const RunConfig& cfg) {
  const std::string& dir = cfg.run.output_dir;
  const toml::node* at = node_at(cfg, "run.output_dir");
  auto fail = [&](const std::string& why) { config_fail(cfg.file, at, ax::str("run.output_dir ", why)); };
  if (dir.empty()) fail("is empty (a directory for checkpoints, metrics.jsonl and report.html)");
  if (dir.find('\0') != std::string::npos) fail(ax::str("contains a NUL byte (\"", dir.substr(0, dir.find('\0')), "\\0...\")"));
  std::error_code ec;
  fs::path probe = fs::path(dir);
  while (!fs::exists(fs::symlink_status(probe, ec))) {
    if (!probe.has_parent_path() || probe.parent_path() == probe) {
      probe = ".";  // a relative path none of whose parts exists: created in the working directory
      break;
    }
    probe = probe.parent_path();
  }
  if (!fs::is_directory(probe, ec))
    fail(probe == fs::path(dir) ? ax::str(dir, " exists and is not a directory")
                                : ax::str(dir, " cannot be created: ", probe.string(), " is not a directory"));
  struct statfs fsinfo {};
  if (::statfs(probe.c_str(), &fsinfo) == 0) {
    // Kernel filesystems that hold no files of ours: mkdir fails there, or a write means something else.
    static const std::pair<unsigned long, const char*> pseudo[] = {
        {0x9fa0, "proc"}, {0x62656572, "sysfs"}, {0x27e0eb, "cgroup"}, {0x63677270, "cgroup2"}, {0x1cd1, "devpts"},
        {0x64626720, "debugfs"}, {0x74726163, "tracefs"}, {0x73636673, "securityfs"}, {0x62656570, "configfs"},
        {0xcafe4a11, "bpf"}, {0x6165676c, "pstore"}, {0xde5e81e4, "efivarfs"}, {0x42494e4d, "binfmt_misc"}};
    for (const auto& [magic, name] : pseudo)
      if (static_cast<unsigned long>(fsinfo.f_type) == magic)
        fail(ax::str(dir, " is on ", probe.string(), ", a ", name, " filesystem, which holds no files of a run"));
  }
  struct statvfs vfs {};
  if (::statvfs(probe.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY)) fail(ax::str(dir, " is on a read-only filesystem (", probe.string(), ")"));
  if (::access(probe.c_str(), W_OK | X_OK) != 0) fail(ax::str(dir, ": ", probe.string(), " is not writable by this user"));
}

// A fresh start into a directory holding anything would mix two runs (old checkpoints pruned among new ones,
// a report over both): refused unless --overwrite says to replace it. Resuming continues what is there.
void check_output_dir(const RunConfig& cfg, const std::string& resume_from, bool overwrite) {
  if (overwrite && !resume_from.empty())
    throw UsageError(ax::str(cfg.file, ": --overwrite starts afresh but the run resumes (--resume or checkpoint.resume_from = \"",
                             resume_from, "\"); give one of them"));
  const fs::path out(cfg.run.output_dir);
  std::error_code ec;
  if (!resume_from.empty() || overwrite || !fs::is_directory(out, ec)) return;
  // The lock file a run killed before writing anything left (axengine/dir_lock.hpp) does not count.
  bool empty = true;
  for (const auto& e : fs::directory_iterator(out, ec)) empty &= e.path().filename() == kDirLockFile;
  if (empty) return;
  throw UsageError(ax::str(cfg.file, ": run.output_dir ", out.string(), " is not empty (a previous run's output?); "
                           "continue it with --resume, start over in it with --overwrite, or set another run.output_dir"));
}

// fp16 trains with dynamic loss scaling (train/loss_scaler.hpp), which unscales and updates fp32 master weights, as
// torch's GradScaler requires (it refuses fp16 gradients) and peft provides (it keeps adapters in fp32): LoRA factors
// in fp16, new (lora.dtype = "compute") or read from an fp16 adapter (lora.init_from), are refused.
void check_fp16_master_weights(const Engine& engine, const LoraConfig& lora) {
  if (engine.dtype != "fp16") return;
  const RunConfig& cfg = engine.config;
  if (lora.init_from.empty()) {
    if (lora.spec.dtype == "compute")
      throw UsageError(ax::str(cfg.file, ": lora.dtype = \"compute\" with model.dtype = \"fp16\": fp16 trains with loss scaling "
                               "on fp32 LoRA factors (master weights); set lora.dtype = \"fp32\" (the default)"));
    return;
  }
  const std::string file = (std::filesystem::path(lora.init_from) / "adapter_model.safetensors").string();
  if (!std::filesystem::exists(file)) return;  // the model check names what is missing
  for (const auto& t : safetensors::File::open(file)->tensors())
    if (t.scalar_type == at::kHalf)
      throw UsageError(ax::str(cfg.file, ": lora.init_from ", file, " holds fp16 factors ('", t.name, "'); model.dtype = \"fp16\" "
                               "trains with loss scaling on fp32 LoRA factors (master weights): convert the adapter to fp32"));
}

// What trains: the adapter (lora.targets, or lora.init_from's), train.unfrozen_parameters, or both; neither is refused
// (a run that updates nothing). Unfrozen base tensors are not cut over ranks by shard_base, nor reduced over
// expert-parallel groups: refused with either.
void check_something_trains(const RunConfig& cfg, const LoraConfig& lora, const TrainConfig& train, const DistributedConfig& dist) {
  if (lora.spec.targets.empty() && lora.init_from.empty() && train.unfrozen_parameters.empty())
    config_fail(cfg.file, node_at(cfg, "lora.targets"),
                "lora.targets is empty (no adapter) and train.unfrozen_parameters is not set: nothing would train");
  // The vision side's adapters are part of the language model's adapter (one peft adapter): no adapter, none.
  if (lora.spec.targets.empty() && lora.init_from.empty() && !lora.spec.vision_targets.empty())
    config_fail(cfg.file, node_at(cfg, "lora.vision_targets"),
                "lora.vision_targets needs an adapter on the language model too: lora.targets is empty (no adapter)");
  if (!train.unfrozen_parameters.empty() && dist.shard_base)
    config_fail(cfg.file, node_at(cfg, "train.unfrozen_parameters"),
                "train.unfrozen_parameters cannot be used with [distributed] shard_base: its layers' base tensors are frozen "
                "shards, gathered for each use");
  if (!train.unfrozen_parameters.empty() && dist.expert_parallel > 1)
    config_fail(cfg.file, node_at(cfg, "train.unfrozen_parameters"),
                "train.unfrozen_parameters cannot be used with [distributed] expert_parallel: the expert-parallel gradient "
                "reduction covers LoRA factors only");
}

// data.sequence_len against the data and the device: rows mostly padding are warned about (every step computes
// the padding: 514 tokens padded to 1,048,576 run for hours), and a sequence length whose activations cannot fit
// the device's memory by the lower bound of memory_estimate.hpp is refused, with the estimate.
// tiled_mlp = "auto" (choose_mlp_tiles), said in the log: untiled where tiling cannot apply (expert_parallel,
// shard_base) or the device's memory is unknown.
int64_t auto_mlp_tiles(const RunConfig& cfg, const RunPlan& p, const nlohmann::json& hf, const ActivationShape& shape,
                       const std::optional<DeviceMemory>& have) {
  std::optional<int64_t> n;
  std::string why;
  if (p.distributed.shard_base || p.distributed.expert_parallel > 1) why = "tiling is not built with shard_base or expert_parallel";
  else if (!have) why = "the device's memory is unknown";
  else if (!(n = choose_mlp_tiles(hf, shape, have->bytes))) why = "config.json lacks the sizes of the activation estimate";
  const int64_t tiles = n.value_or(1);
  log::info(ax::str(cfg.file, ": train.tiled_mlp = \"auto\": ", tiles, tiles == 1 ? " shard (untiled)" : " shards",
                    why.empty() ? ax::str(" (the estimate against ", kAutoTileShare, " of ", format_bytes(have->bytes), ")")
                                : ax::str(" (", why, ")")));
  return tiles;
}

void check_sequence_len(const Engine& engine, RunPlan& p) {
  const RunConfig& cfg = engine.config;
  const int64_t seq = p.data_config.sequence_len;
  const auto& rows = p.steps.train_rows;
  if (!p.data.stream && !rows.rows.empty()) {
    const double fill = double(rows.tokens) / (double(rows.rows.size()) * double(seq));
    if (fill < 0.05) {
      std::size_t longest = 0;
      for (const auto& sample : p.data.train) longest = std::max(longest, sample.input_ids.size());
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.2g %%", 100 * fill);
      log::warn(ax::str(cfg.file, ": data.sequence_len = ", seq, ": the packed rows are ", pct, " filled (", rows.tokens,
                        " tokens in ", rows.rows.size(), " row(s) of ", seq, "; the longest sample has ", longest,
                        " tokens): every step computes the padding too. Lower data.sequence_len"));
    }
  }
  const nlohmann::json hf = models::read_json_file(cfg.model.path + "/config.json");
  ActivationShape shape;
  shape.rows = p.train.micro_batch_size;
  shape.sequence_len = seq;
  shape.dtype_bytes = engine.dtype == "fp32" ? 4 : 2;
  shape.activation_checkpointing = p.train.activation_checkpointing;
  shape.activation_offload = p.train.activation_offload && engine.device.is_cuda();
  shape.context_parallel = p.dist_env.world / data_world(p);
  // The backends selection picks for this device and dtype.
  for (const auto& r : engine.resolve_all()) {
    if (r.op == ops::LinearCe::kOp) shape.logits_whole = r.chosen == "reference";
    if (r.op == ops::Attention::kOp) shape.attention_scores = r.chosen == "reference";
  }
  const auto have = device_memory(engine.device);
  if (p.train.tiled_mlp_auto) p.train.tiled_mlp = auto_mlp_tiles(cfg, p, hf, shape, have);
  shape.mlp_tiles = p.train.tiled_mlp;
  const auto need = estimate_activations(hf, shape);
  if (!need) return;
  const std::string estimate = ax::str("at least ", format_bytes(need->bytes), " of activations a micro-batch (", need->detail, ")");
  if (!have) {
    p.memory = estimate;
    return;
  }
  p.memory = ax::str(estimate, "; ", format_bytes(have->bytes), " available (", have->source, ")");
  if (need->bytes > have->bytes)
    config_fail(cfg.file, node_at(cfg, "data.sequence_len"),
                ax::str("data.sequence_len = ", seq, " (with train.micro_batch_size = ", shape.rows, ") needs ", estimate,
                        ", more than the ", format_bytes(have->bytes), " available (", have->source,
                        "): it cannot run here. Lower data.sequence_len or train.micro_batch_size",
                        shape.activation_checkpointing ? "" : ", or set train.activation_checkpointing = true"));
}

// [train] tiled_mlp shards the MLP block's tokens, each shard its own recompute node run again in the main backward,
// after the layer's call: where a layer's weights are there only during its call (shard_base) or its experts'
// all-to-all must run the same number of times on every rank (expert_parallel) it cannot apply.
void check_tiled_mlp(const RunConfig& cfg, const TrainConfig& train, const DistributedConfig& d) {
  if (train.tiled_mlp <= 1) return;
  const char* with = d.shard_base ? "distributed.shard_base = true" : d.expert_parallel > 1 ? "distributed.expert_parallel > 1" : nullptr;
  if (with)
    config_fail(cfg.file, node_at(cfg, "train.tiled_mlp"),
                ax::str("'train.tiled_mlp' = ", train.tiled_mlp, ": not together with ", with,
                        " (each shard is recomputed in backward outside its layer's call); set tiled_mlp = 1 or turn that off"));
}

}  // namespace

int64_t data_world(const RunPlan& p) {
  const int64_t cp = p.dist_env.launched ? p.distributed.context_parallel : 1;
  return p.dist_env.world / cp;
}

namespace {
// " x N ranks" of the plan's steps line: the data-parallel ranks (a context-parallel group trains one row set).
std::string ranks_note(const RunPlan& p) {
  if (p.dist_env.world <= 1) return {};
  const int64_t cp = p.dist_env.world / data_world(p);
  return cp > 1 ? ax::str(" x ", data_world(p), " data-parallel ranks, each row split over ", cp, " context-parallel ranks")
                : ax::str(" x ", p.dist_env.world, " ranks");
}
}  // namespace

ModelLoadOptions model_load_options(const Engine& engine, const LoraConfig& lora, const TrainConfig& train) {
  const RunConfig& cfg = engine.config;
  ModelLoadOptions o;
  o.dir = cfg.model.path;
  o.dtype = engine.dtype;
  o.device = engine.device.is_cuda() ? ax::str("cuda:", engine.device.index) : "cpu";
  o.kernels = engine.kernel_set();
  o.activation_checkpointing = train.activation_checkpointing;
  o.weights = weight_policy(cfg.model);  // QLoRA: how the frozen base is packed at load
  if (!lora.init_from.empty()) o.adapter_dir = lora.init_from;
  else if (!lora.spec.targets.empty()) o.lora = lora.spec;  // lora.targets = []: no adapter
  return o;
}

ModelCheck check_run_model(const Engine& engine, const ModelLoadOptions& options) {
  try {
    return check_model(engine.registry, options);
  } catch (const UsageError& e) {
    throw UsageError(ax::str(engine.config.file, ": ", e.what()));  // which run's model it is
  }
}

std::vector<Resolution> kernel_plan(const Engine& engine, const ModelCheck& model) {
  return model.ops.empty() ? engine.resolve_all() : engine.resolve_calls(model.ops, model.quantize);
}

RunPlan plan_run(const Engine& engine, const TrainOptions& options) {
  const RunConfig& cfg = engine.config;
  RunPlan p;
  p.data_config = data::read_data_config(cfg);
  p.train = read_train_config(cfg);
  p.checkpoint = read_checkpoint_config(cfg);
  p.eval = read_eval_config(cfg);
  p.profile = read_profile_config(cfg);
  p.distributed = read_distributed_config(cfg);
  p.dist_env = read_dist_env();
  p.lora = read_lora_config(cfg);
  if (options.resume && p.checkpoint.resume_from.empty()) p.checkpoint.resume_from = "latest";
  if (p.checkpoint.resume_from != "latest") p.checkpoint.resume_from = data::resolve_against(cfg.dir, p.checkpoint.resume_from);

  check_model_path(cfg);
  check_output_dir_usable(cfg);
  check_dataset_entries(engine);
  check_kernel_lists(engine);
  check_optimizer(engine, p.train);
  check_init_from(cfg, p.lora, engine.dtype);
  check_fp16_master_weights(engine, p.lora);
  check_something_trains(cfg, p.lora, p.train, p.distributed);

  p.model = model_load_options(engine, p.lora, p.train);
  p.model_check = check_run_model(engine, p.model);
  try {
    p.unfrozen = models::plan_unfrozen(p.model, p.train.unfrozen_parameters);
  } catch (const UsageError& e) {
    throw UsageError(ax::str(cfg.file, ": ", e.what()));  // which run's model it is
  }
  p.backends = check_backends(engine, p.model_check);

  p.tokenizer = load_hf_tokenizer(cfg.model.path);
  p.data = data::prepare_datasets(cfg, p.data_config, engine.registry, *p.tokenizer, model_vocab_size(cfg.model.path),
                                  model_image_processor(cfg.model.path));
  check_eval_rows(cfg, p.eval, p.data.eval.size());
  check_context_parallel(cfg, p.distributed, p.dist_env, p.data_config.sequence_len);
  p.steps = plan_steps(p.data, p.data_config.sequence_len, p.train, static_cast<uint64_t>(cfg.run.seed), data_world(p));
  check_sequence_len(engine, p);
  p.resume = find_resume_checkpoint(p.checkpoint, cfg.run.output_dir);
  check_output_dir(cfg, p.checkpoint.resume_from, options.overwrite);
  if (p.resume) check_resume_fits(*p.resume, p.steps.steps_per_epoch, p.steps.total_steps, cfg.run.seed);
  check_expert_parallel(cfg, p.distributed, p.dist_env, p.resume.has_value(), p.eval.exact_match);
  check_shard_base(cfg, p.distributed, p.dist_env, p.eval.exact_match);

  check_tiled_mlp(cfg, p.train, p.distributed);
  p.device_problem = run_device_problem(engine.device, cfg.device.type);
  if (p.train.activation_offload && !engine.device.is_cuda())
    log::warn(ax::str(cfg.file, ": train.activation_offload = true on the CPU: the layer inputs already live in host "
                      "memory, so nothing is offloaded (activation checkpointing still applies)"));
  return p;
}

std::vector<std::string> describe_plan(const Engine& engine, const RunPlan& p) {
  std::vector<std::string> out;
  const int64_t lora = p.model_check.lora_modules;
  const std::size_t unfrozen = p.unfrozen.names.size();
  out.push_back(ax::str("model    ", p.model_check.summary, lora ? ax::str("; LoRA on ", lora, " modules") : std::string(),
                        p.model.adapter_dir.empty() ? std::string() : ax::str(" (continuing ", p.model.adapter_dir, ")"),
                        unfrozen ? ax::str("; ", unfrozen, " base parameters unfrozen (", p.unfrozen.elements, " elements)")
                                 : std::string()));
  if (p.data.stream)
    out.push_back(ax::str("data     streamed from ", p.data.stream->stream().shards().size(), " shard(s) (", p.data.stream->name(),
                          "), packed into rows of ", p.data_config.sequence_len, " tokens as read; ", p.data.eval.size(), " eval samples"));
  else
  out.push_back(ax::str("data     ", p.data.train.size(), " train / ", p.data.eval.size(), " eval samples -> ",
                        p.steps.train_rows.rows.size(), " rows of ", p.data_config.sequence_len, " tokens"));
  if (p.data.stream)
    out.push_back(ax::str("steps    ", p.steps.total_steps, " (train.max_steps; ", p.train.micro_batch_size, " x ", p.train.grad_accum,
                          ranks_note(p), " rows each)"));
  else
  out.push_back(ax::str("steps    ", p.steps.steps_per_epoch, " per epoch (", p.train.micro_batch_size, " x ", p.train.grad_accum,
                        ranks_note(p), " rows each), ",
                        p.steps.total_steps, " in all"));
  std::vector<std::string> chosen;
  for (const auto& r : p.backends) chosen.push_back(r.op + " " + r.chosen);
  out.push_back(ax::str("kernels  ", engine.device.arch_name(), ": ", join(chosen, ", ")));
  if (p.resume) out.push_back(ax::str("resume   from ", p.resume->dir, " at step ", p.resume->state.step));
  else if (!p.checkpoint.resume_from.empty()) out.push_back("resume   no checkpoint yet: from step 0");
  if (p.memory) out.push_back("memory   " + *p.memory);
  if (p.device_problem) out.push_back("note     run on this machine would stop: " + *p.device_problem);
  return out;
}

// config.json's vocab_size (the embedding's rows), so that data preparation refuses a token id the model does
// not have and names its row, instead of the forward pass failing later without one. 0 when the file or the
// key is missing or odd: loading the model reports that.
int64_t model_vocab_size(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  const nlohmann::json j = models::read_json_file(path);
  if (!j.is_object()) return 0;
  auto it = j.find("vocab_size");
  return it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0 ? it->get<int64_t>() : 0;
}

}  // namespace ax::train
