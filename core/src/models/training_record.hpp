// What an adapter was trained with, kept beside it: `run` writes axengine_training.json next to
// adapter_config.json in every checkpoint (peft reads adapter_config.json and adapter_model.safetensors only, so
// the directory stays a plain peft adapter). `merge-lora` reads it to rebuild the base the adapter learned
// against (a QLoRA adapter trained on an nf4 base merged onto the dense base gives another model), and
// `generate` / `chat` to prompt as the data was rendered (template kwargs). `merge-lora` writes
// axengine_merge.json into the merged model: what was merged into what, and the adapter's training record.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/model.hpp"

namespace ax::models {

inline constexpr const char* kTrainingRecordFile = "axengine_training.json";
inline constexpr const char* kMergeRecordFile = "axengine_merge.json";

struct TrainingRecord {
  std::string base_model;             // [model] path as the run resolved it
  WeightPolicy weights;               // [model] weight_format, skip_modules, quant_blocksize, double_quant
  std::string base_format = "dense";  // what the frozen base held (weight_stats().format: a pre-quantised nf4
                                      // checkpoint is "nf4" under weight_format "dense")
  std::string dtype;                  // the compute dtype: fp32, bf16, fp16
  // The template_kwargs of each chat_template dataset of the run ({} for one without), in config order.
  std::vector<nlohmann::json> template_kwargs;
  std::string run_config;             // the config file
  std::string axengine_version;

  nlohmann::json to_json() const;
};

// Writes `record` into `dir` (atomically, fsynced; crash points adapter.file_*).
void write_training_record(const std::string& dir, const TrainingRecord& record);

// The record of an adapter directory; nullopt when it has none (an adapter made elsewhere, or by an axengine
// before records). UsageError naming the file when it is not one this version reads.
std::optional<TrainingRecord> read_training_record(const std::string& adapter_dir);

// The record a merged model dir keeps from its adapter (axengine_merge.json's "training"); nullopt when none.
std::optional<TrainingRecord> read_merged_training_record(const std::string& model_dir);

// What merge-lora folds into what: the base dir and the weight policy to load it with, from --model / --config
// (`explicit_weights`) and the adapter's training record. The record decides when --config is absent; a --config
// whose weight keys differ is refused (UsageError naming both), as is a base that is neither given nor recorded.
// Without a record the base is taken as stored, with a warning that a QLoRA adapter needs its run's --config.
struct MergePlan {
  std::string model_dir;
  WeightPolicy weights;
  std::optional<TrainingRecord> record;
};
MergePlan plan_merge(const std::string& model_dir, const std::string& adapter_dir,
                     const std::optional<WeightPolicy>& explicit_weights);
// After the base loaded: it must hold what the adapter trained on (`loaded_format`, the loaded model's
// weight_stats().format): a pre-quantised nf4 checkpoint's adapter on a dense copy of it is refused (UsageError
// starting with `command`). Nothing to check without a record.
void check_trained_base(const std::optional<TrainingRecord>& record, const std::string& adapter_dir,
                        const std::string& model_dir, const std::string& loaded_format, const std::string& command);
// axengine_merge.json's text: base, adapter, weights, base_format, dtype, version, and the training record.
std::string merge_record_json(const MergePlan& plan, const std::string& adapter_dir, const std::string& base_format,
                              const std::string& dtype);

// "nf4 (quant_blocksize 64, double_quant true, skip_modules [o_proj])", "dense".
std::string describe_weights(const WeightPolicy& policy);
// Whether two policies pack a base the same way (skip_modules as sets; the nf4 keys only for nf4).
bool same_weights(const WeightPolicy& a, const WeightPolicy& b);

// The template kwargs a generation defaults to from a record: the one object every chat_template dataset of
// the run used; nullopt when there is none, or when they differ (`why` says so).
std::optional<nlohmann::json> default_template_kwargs(const TrainingRecord& record, std::string& why);

}  // namespace ax::models
