#include "train/train_config.hpp"

#include <cmath>
#include <limits>
#include <utility>

#include "axengine/strings.hpp"
#include "train/optimizers.hpp"

namespace ax::train {
namespace {

const toml::table* section(const RunConfig& c, const char* name) {
  const toml::node* n = c.document.get(name);
  return n ? n->as_table() : nullptr;
}

void bind_train(TableBinder& t, TrainConfig& c) {
  t.field("optimizer", c.optimizer, "optimizer provider (registry kind optimizer): adamw, or one a plugin adds");
  t.positive("lr", c.lr, "peak learning rate");
  t.choice("schedule", c.schedule, {"constant", "linear", "cosine"}, "learning-rate schedule after warmup");
  t.bounded("warmup_steps", c.warmup_steps, 0, INT64_MAX, "steps of linear warmup from 0 to lr");
  t.field("min_lr_ratio", c.min_lr_ratio, "linear/cosine decay ends at lr * min_lr_ratio");
  t.field("weight_decay", c.weight_decay, "decoupled weight decay (AdamW); never applied to norms and biases");
  t.bounded("micro_batch_size", c.micro_batch_size, 1, 1 << 20, "packed rows per forward pass");
  t.bounded("grad_accum", c.grad_accum, 1, 1 << 20, "micro-batches per optimizer step");
  t.field("max_grad_norm", c.max_grad_norm, "clip gradients to this global L2 norm (0 = no clipping)");
  t.bounded("num_epochs", c.num_epochs, 1, 1 << 20, "passes over the training rows (ignored when max_steps > 0)");
  t.bounded("max_steps", c.max_steps, 0, INT64_MAX, "optimizer steps to run; 0 = num_epochs worth");
  t.field("activation_checkpointing", c.activation_checkpointing, "recompute each layer's activations in backward (less memory, more compute)");
  t.field("activation_offload", c.activation_offload, "with activation checkpointing, move each layer's saved input to pinned host memory after its forward (on a side stream, overlapping compute) and bring it back before its backward, prefetching the layer below's: device memory for the layer inputs no longer grows with the layer count. Implies activation_checkpointing (refused with activation_checkpointing = false). On the CPU nothing moves (the inputs already live in host memory; validate warns); docs/training.md, \"Long context\"");
  if (c.activation_offload && !c.activation_checkpointing) {
    const toml::node* ckpt = t.table() ? t.table()->get("activation_checkpointing") : nullptr;
    if (ckpt)
      t.fail(ckpt, "'train.activation_offload = true' moves the layer inputs that activation checkpointing keeps: it needs "
                   "'train.activation_checkpointing = true' (or leave activation_checkpointing out: offload implies it)");
    c.activation_checkpointing = true;  // as axolotl's gradient_checkpointing: offload
  }
  const char* tiled_doc = "run the MLP / MoE block of each decoder layer over its tokens in this many shards, forward and backward, each shard recomputed in backward, so the block's intermediates exist for one shard at a time (1 = untiled), or \"auto\": the fewest shards (a power of two) whose activation estimate (the one validate prints) fits half the device's memory. Losses and LoRA grads equal the untiled run's to fp32 rounding; LoRA dropout draws other masks. Not with distributed.expert_parallel or shard_base; docs/training.md, \"Long context\"";
  const toml::node* tiled = t.table() ? t.table()->get("tiled_mlp") : nullptr;
  if (tiled && tiled->is_string()) {
    std::string v;
    t.choice("tiled_mlp", v, {"auto"}, tiled_doc);
    c.tiled_mlp_auto = true;
  } else {
    t.bounded("tiled_mlp", c.tiled_mlp, 1, 1 << 20, tiled_doc);
  }
  t.bounded("log_every", c.log_every, 1, INT64_MAX, "log a line every N steps when stderr is not a terminal");
  t.field("tensorboard", c.tensorboard, "write TensorBoard event files (the metrics.jsonl scalars) into output_dir");
  t.field("unfrozen_parameters", c.unfrozen_parameters, "base parameters that train too (full fine-tuning of the matched tensors, beside the LoRA adapter or alone with lora.targets = []): regular expressions as axolotl's unfrozen_parameters, over the parameter names transformers gives (\"^lm_head.weight$\", \"^model.embed_tokens.weight$\", \".*\" for all); every '.' is a literal dot and a pattern matches from the name's start (Python's re.match). Each must match a parameter; packed (nf4/mxfp4/nvfp4/fp8) weights, fused MoE experts and modules with a LoRA adapter are refused. They train in lora.dtype (fp32 master weights by default) with the same AdamW, clipping and weight-decay rules as the adapter; docs/training.md");
  t.bounded("cpu_threads", c.cpu_threads, 0, 4096, "intra-op CPU threads (0 = LibTorch's default); more than the cores this process may use is clamped to them, with a warning; small models on busy machines run fastest with 1");
  // The optimizer applies these to fp32 (or narrower) parameters as scalars of their dtype: beyond a float's
  // range c10 refuses the conversion in the first step, naming no key.
  for (const auto& [key, v] : {std::pair{"lr", c.lr}, std::pair{"weight_decay", c.weight_decay}})
    if (std::abs(v) > std::numeric_limits<float>::max())
      t.fail(t.table() ? t.table()->get(key) : nullptr,
             ax::str("'train.", key, "' is ", v, ", beyond what a float holds (", std::numeric_limits<float>::max(),
                     "): the optimizer steps in fp32"));
  if (c.min_lr_ratio < 0 || c.min_lr_ratio > 1) t.fail(t.table() ? t.table()->get("min_lr_ratio") : nullptr, "'train.min_lr_ratio' must be in [0, 1]");
  if (c.weight_decay < 0) t.fail(t.table() ? t.table()->get("weight_decay") : nullptr, "'train.weight_decay' must be >= 0");
  if (c.max_grad_norm < 0) t.fail(t.table() ? t.table()->get("max_grad_norm") : nullptr, "'train.max_grad_norm' must be >= 0");
}

void bind_checkpoint(TableBinder& t, CheckpointConfig& c) {
  t.bounded("every_steps", c.every_steps, 0, INT64_MAX, "save a checkpoint every N steps (0 = only at the end)");
  t.field("every_minutes", c.every_minutes, "also save one at the first step boundary when this many minutes have passed since the last checkpoint (or the start), so a long run always has a recent one; 0 = off. Distributed: rank 0's clock decides, for all ranks");
  if (!(c.every_minutes >= 0) || !std::isfinite(c.every_minutes))
    t.fail(t.table() ? t.table()->get("every_minutes") : nullptr, "'checkpoint.every_minutes' must be a number of minutes >= 0 (0 = off)");
  t.bounded("keep_last", c.keep_last, 1, 1 << 20, "checkpoints kept; older ones are deleted after a newer one is complete");
  t.field("resume_from", c.resume_from, "\"latest\" (the newest checkpoint in output_dir that verifies; a fresh start when there is none) or a checkpoint directory (relative to the config file); `run --resume` = \"latest\"");
}

void bind_eval(TableBinder& t, EvalConfig& c) {
  t.bounded("every_steps", c.every_steps, 0, INT64_MAX, "evaluate every N steps (0 = only at the end); needs eval rows ([data].eval_fraction or eval_path)");
  t.bounded("max_rows", c.max_rows, 0, INT64_MAX, "packed eval rows used for eval loss (0 = all)");
  t.field("exact_match", c.exact_match, "greedy-generate the answer of every eval sample that has a prompt (loss-free prefix) and report the fraction exactly right");
  t.bounded("max_samples", c.max_samples, 1, INT64_MAX, "eval samples used for exact_match");
  t.bounded("max_new_tokens", c.max_new_tokens, 1, 1 << 16, "longest answer generated for exact_match");
  t.bounded("show_examples", c.show_examples, 0, 1000, "generated answers printed at each eval");
}

void bind_profile(TableBinder& t, ProfileConfig& c) {
  t.bounded("start_step", c.start_step, 0, INT64_MAX, "first profiled step (0-based; earlier steps warm the allocator and kernels up)");
  t.bounded("steps", c.steps, 0, 1000, "steps to profile (0 = off); writes <output_dir>/profile/trace.json and summary.txt and logs the summary");
  t.bounded("top", c.top, 1, 1000, "GPU kernels listed in the summary");
}

void bind_train_section(TableBinder& t, RunConfig&) { TrainConfig c; bind_train(t, c); }
void bind_checkpoint_section(TableBinder& t, RunConfig&) { CheckpointConfig c; bind_checkpoint(t, c); }
void bind_eval_section(TableBinder& t, RunConfig&) { EvalConfig c; bind_eval(t, c); }
void bind_profile_section(TableBinder& t, RunConfig&) { ProfileConfig c; bind_profile(t, c); }

// [optimizer] keys belong to the chosen provider, which checks them when it is created (plugins add
// optimizers core does not know). The built-in AdamW's keys are documented and checked here.
void bind_optimizer_section(TableBinder& t, RunConfig& config) {
  std::string name = "adamw";
  if (const toml::table* tr = section(config, "train"))
    if (auto v = tr->get_as<std::string>("optimizer")) name = v->get();
  if (name == "adamw" || !t.table()) {
    AdamWOptions o;
    bind_adamw_options(t, o);
  } else {
    for (const auto& [k, v] : *t.table()) t.accept(std::string(k.str()));
  }
}

struct Registrar {
  Registrar() {
    register_config_section({"train", "the training loop: optimizer, schedule, batch, length", bind_train_section});
    register_config_section({"optimizer", "options of the chosen optimizer (these: adamw)", bind_optimizer_section});
    register_config_section({"checkpoint", "checkpoints (adapter in PEFT format + full trainer state) and resume", bind_checkpoint_section});
    register_config_section({"profile", "profile training steps: Chrome trace and the GPU kernels by time", bind_profile_section});
    register_config_section({"eval", "evaluation on the held-out rows: loss, and exact match of generated answers", bind_eval_section});
  }
} registrar;

template <class C>
C read_section(const RunConfig& config, const char* name, void (*bind)(TableBinder&, C&)) {
  C c;
  TableBinder t(section(config, name), name, BindContext{config.file, nullptr});
  bind(t, c);
  return c;
}

}  // namespace

TrainConfig read_train_config(const RunConfig& config) { return read_section<TrainConfig>(config, "train", bind_train); }

CheckpointConfig read_checkpoint_config(const RunConfig& config) { return read_section<CheckpointConfig>(config, "checkpoint", bind_checkpoint); }

EvalConfig read_eval_config(const RunConfig& config) { return read_section<EvalConfig>(config, "eval", bind_eval); }

ProfileConfig read_profile_config(const RunConfig& config) { return read_section<ProfileConfig>(config, "profile", bind_profile); }

void check_eval_rows(const RunConfig& config, const EvalConfig& eval, std::size_t eval_samples) {
  if (eval_samples > 0) return;
  const toml::table* t = section(config, "eval");
  if (!t) return;
  // Keys that ask for evaluation (every_steps > 0, exact_match = true) or shape one; those that turn it off
  // (every_steps = 0, exact_match = false) say nothing that the missing rows would ignore.
  for (const char* key : {"every_steps", "exact_match", "max_rows", "max_samples", "max_new_tokens", "show_examples"}) {
    const toml::node* n = t->get(key);
    if (!n) continue;
    if (std::string(key) == "every_steps" && eval.every_steps == 0) continue;
    if (std::string(key) == "exact_match" && !eval.exact_match) continue;
    config_fail(config.file, n,
                str("'eval.", key, "' is set, but the data has no eval rows: nothing would be evaluated (give a [[datasets]] "
                    "entry an eval_path or eval_fraction, or set data.eval_fraction > 0; or remove it)"));
  }
}

const toml::table& optimizer_options(const RunConfig& config) {
  static const toml::table empty;
  const toml::table* t = section(config, "optimizer");
  return t ? *t : empty;
}

}  // namespace ax::train
