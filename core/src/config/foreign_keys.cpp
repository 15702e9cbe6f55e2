#include "config/foreign_keys.hpp"

#include "axengine/strings.hpp"

namespace ax {

const std::vector<ForeignKey>& foreign_keys() {
  // Their common keys, most used first. A key that is also ours in some table (`optimizer`, `num_epochs`) is
  // listed for the places where it is not.
  static const std::vector<ForeignKey> keys = {
      {"base_model", "axolotl", false, "model.path", "a local Hugging Face model directory"},
      {"learning_rate", "axolotl", false, "train.lr", ""},
      {"num_epochs", "axolotl", false, "train.num_epochs", ""},
      {"num_train_epochs", "transformers", false, "train.num_epochs", ""},
      {"max_steps", "axolotl", false, "train.max_steps", ""},
      {"micro_batch_size", "axolotl", false, "train.micro_batch_size", ""},
      {"per_device_train_batch_size", "transformers", false, "train.micro_batch_size", ""},
      {"gradient_accumulation_steps", "axolotl", false, "train.grad_accum", ""},
      {"sequence_len", "axolotl", false, "data.sequence_len", "rows are always packed to it (sample_packing)"},
      {"max_seq_length", "trl", false, "data.sequence_len", ""},
      {"sample_packing", "axolotl", false, "", "rows are always packed, to data.sequence_len tokens"},
      {"lr_scheduler", "axolotl", false, "train.schedule", "constant, linear or cosine"},
      {"lr_scheduler_type", "transformers", false, "train.schedule", "constant, linear or cosine"},
      {"warmup_steps", "axolotl", false, "train.warmup_steps", ""},
      {"warmup_ratio", "axolotl", false, "train.warmup_steps", "warmup is given in steps"},
      {"optimizer", "axolotl", false, "train.optimizer", "adamw"},
      {"optim", "transformers", false, "train.optimizer", "adamw"},
      {"weight_decay", "axolotl", false, "train.weight_decay", ""},
      {"adam_beta1", "axolotl", false, "optimizer.beta1", ""},
      {"adam_beta2", "axolotl", false, "optimizer.beta2", ""},
      {"adam_epsilon", "axolotl", false, "optimizer.eps", ""},
      {"max_grad_norm", "axolotl", false, "train.max_grad_norm", ""},
      {"bf16", "axolotl", false, "model.dtype = \"bf16\"", ""},
      {"fp16", "axolotl", false, "model.dtype = \"fp16\"", ""},
      {"tf32", "axolotl", false, "compile.tf32", ""},
      {"gradient_checkpointing", "axolotl", false, "train.activation_checkpointing", "its \"offload\": train.activation_offload"},
      {"val_set_size", "axolotl", false, "data.eval_fraction", "a fraction; or a dataset's eval_path"},
      {"test_datasets", "axolotl", false, "datasets[].eval_path", "a file of eval rows per [[datasets]] entry"},
      {"save_steps", "axolotl", false, "checkpoint.every_steps", ""},
      {"save_total_limit", "axolotl", false, "checkpoint.keep_last", ""},
      {"eval_steps", "axolotl", false, "eval.every_steps", ""},
      {"logging_steps", "axolotl", false, "train.log_every", ""},
      {"seed", "axolotl", false, "run.seed", ""},
      {"output_dir", "axolotl", false, "run.output_dir", ""},
      {"resume_from_checkpoint", "axolotl", false, "checkpoint.resume_from", "or axengine run --resume"},
      {"dataset_prepared_path", "axolotl", false, "data.cache_dir", ""},
      {"load_in_4bit", "axolotl", false, "model.weight_format = \"nf4\"", "QLoRA"},
      {"load_in_8bit", "axolotl", false, "", "8-bit bases are not supported: model.weight_format = \"nf4\" packs the base in 4 bits"},
      {"adapter", "axolotl", false, "", "every run trains a LoRA adapter, set in [lora]; for qlora add model.weight_format = \"nf4\""},
      {"lora_r", "axolotl", false, "lora.r", ""},
      {"lora_alpha", "axolotl", false, "lora.alpha", ""},
      {"lora_dropout", "axolotl", false, "lora.dropout", ""},
      {"lora_target_modules", "axolotl", false, "lora.targets", ""},
      {"target_modules", "peft", false, "lora.targets", ""},
      {"lora_target_linear", "axolotl", false, "lora.targets", "name the projections: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"},
      {"lora_model_dir", "axolotl", false, "lora.init_from", ""},
      {"peft_use_rslora", "axolotl", false, "lora.rslora", ""},
      {"use_rslora", "peft", false, "lora.rslora", ""},
      {"flash_attention", "axolotl", false, "kernels.attention", "the attention backend is chosen per GPU; `axengine plugins explain` shows it"},
      {"chat_template", "axolotl", false, "datasets[].chat_template", "set per [[datasets]] entry"},
      {"train_on_inputs", "axolotl", false, "datasets[].prompt_field", "a prompt gets no loss (completion); chat: datasets[].train_on"},
      {"deepspeed", "axolotl", false, "", "start several processes with `axengine launch` or torchrun; [distributed] shard_base = true splits the frozen base"},
      {"fsdp", "axolotl", false, "", "start several processes with `axengine launch` or torchrun; [distributed] shard_base = true splits the frozen base"},
      // Keys of one of their `datasets` entries.
      {"data_files", "axolotl", true, "datasets[].path", "a file or a glob"},
      {"ds_type", "axolotl", true, "", "the file's extension decides: .jsonl, .json or .parquet"},
      {"split", "axolotl", true, "", "training rows come from path; eval rows from eval_path or eval_fraction"},
      {"field", "axolotl", true, "datasets[].text_field", ""},
      {"field_instruction", "axolotl", true, "datasets[].instruction_field", ""},
      {"field_input", "axolotl", true, "datasets[].input_field", ""},
      {"field_output", "axolotl", true, "datasets[].output_field", ""},
      {"chat_template_jinja", "axolotl", true, "datasets[].chat_template", "the path of a .jinja file"},
      {"message_property_mappings", "axolotl", true, "datasets[].message_field_role", "and datasets[].message_field_content"},
      {"roles_to_train", "axolotl", true, "datasets[].train_on", "assistant, all or last"},
  };
  return keys;
}

std::string foreign_key_hint(const std::string& table_path, const std::string& key) {
  const bool in_entry = table_path == "datasets";
  for (const auto& k : foreign_keys()) {
    if (k.name != key || (k.dataset_entry && !in_entry)) continue;
    const std::string theirs = str(k.name, " is ", k.from, "'s name for it");
    const std::string where = "docs/config.md, \"From axolotl\"";
    if (k.ours.empty()) return str(k.name, " is ", k.from, "'s key: ", k.note, "; ", where);
    const bool setting = k.ours.find(' ') != std::string::npos;
    return str("did you mean ", setting ? k.ours : "'" + k.ours + "'", "? ", theirs, k.note.empty() ? "" : " (" + k.note + ")",
               "; ", where);
  }
  return "";
}

std::string foreign_keys_markdown() {
  std::string out = "| their key | whose | axengine | note |\n|---|---|---|---|\n";
  for (const auto& k : foreign_keys())
    out += str("| `", k.name, "`", k.dataset_entry ? " (in a `datasets` entry)" : "", " | ", k.from, " | ",
               k.ours.empty() ? "—" : "`" + k.ours + "`", " | ", k.note, " |\n");
  return out;
}

}  // namespace ax
