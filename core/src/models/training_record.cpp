#include "models/training_record.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "axengine/version.hpp"

namespace ax::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTrainingFormat = "axengine-training-record-v1";

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

json read_json(const std::string& path) {
  json j = json::parse(read_regular_file(path), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw UsageError(str(path, ": not a JSON object"));
  return j;
}

json weights_json(const WeightPolicy& w) {
  json out = {{"weight_format", w.format}, {"skip_modules", w.skip_modules}};
  if (w.format == "nf4") {
    out["quant_blocksize"] = w.blocksize;
    out["double_quant"] = w.double_quant;
  }
  return out;
}

std::string absolute(const std::string& p) {
  std::error_code ec;
  return fs::absolute(p, ec).lexically_normal().string();
}

TrainingRecord parse_record(const json& j, const std::string& where) {
  auto bad = [&](const std::string& key, const std::string& what) { return UsageError(str(where, ": '", key, "' ", what)); };
  if (j.value("format", json()) != kTrainingFormat)
    throw bad("format", str("must be \"", kTrainingFormat, "\" (a training record of another axengine version?)"));
  auto string = [&](const char* key, std::string& out, bool required) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) throw bad(key, "is missing");
      return;
    }
    if (!it->is_string()) throw bad(key, "must be a string");
    out = it->get<std::string>();
  };
  TrainingRecord r;
  string("base_model", r.base_model, false);
  string("base_format", r.base_format, true);
  string("dtype", r.dtype, false);
  string("run_config", r.run_config, false);
  string("axengine_version", r.axengine_version, false);
  auto w = j.find("weights");
  if (w == j.end() || !w->is_object()) throw bad("weights", "must be an object");
  if (!w->contains("weight_format") || !(*w)["weight_format"].is_string()) throw bad("weights.weight_format", "must be a string");
  r.weights.format = (*w)["weight_format"].get<std::string>();
  if (w->contains("skip_modules")) {
    const json& s = (*w)["skip_modules"];
    if (!s.is_array()) throw bad("weights.skip_modules", "must be a list of strings");
    for (const auto& e : s) {
      if (!e.is_string()) throw bad("weights.skip_modules", "must be a list of strings");
      r.weights.skip_modules.push_back(e.get<std::string>());
    }
  }
  if (w->contains("quant_blocksize")) {
    if (!(*w)["quant_blocksize"].is_number_integer()) throw bad("weights.quant_blocksize", "must be an integer");
    r.weights.blocksize = (*w)["quant_blocksize"].get<int64_t>();
  }
  if (w->contains("double_quant")) {
    if (!(*w)["double_quant"].is_boolean()) throw bad("weights.double_quant", "must be true or false");
    r.weights.double_quant = (*w)["double_quant"].get<bool>();
  }
  if (auto k = j.find("template_kwargs"); k != j.end() && !k->is_null()) {
    if (!k->is_array()) throw bad("template_kwargs", "must be a list of objects");
    for (const auto& e : *k) {
      if (!e.is_object()) throw bad("template_kwargs", "must be a list of objects");
      r.template_kwargs.push_back(e);
    }
  }
  return r;
}

}  // namespace

json TrainingRecord::to_json() const {
  return {{"format", kTrainingFormat},
          {"base_model", base_model},
          {"weights", weights_json(weights)},
          {"base_format", base_format},
          {"dtype", dtype},
          {"template_kwargs", template_kwargs},
          {"run_config", run_config},
          {"axengine_version", axengine_version}};
}

void write_training_record(const std::string& dir, const TrainingRecord& record) {
  safetensors::write_file_atomic((fs::path(dir) / kTrainingRecordFile).string(), record.to_json().dump(2) + "\n", "adapter");
}

std::optional<TrainingRecord> read_training_record(const std::string& adapter_dir) {
  const std::string path = (fs::path(adapter_dir) / kTrainingRecordFile).string();
  if (!exists(path)) return std::nullopt;
  return parse_record(read_json(path), path);
}

std::optional<TrainingRecord> read_merged_training_record(const std::string& model_dir) {
  const std::string path = (fs::path(model_dir) / kMergeRecordFile).string();
  if (!exists(path)) return std::nullopt;
  const json j = read_json(path);
  auto t = j.find("training");
  if (t == j.end() || t->is_null()) return std::nullopt;
  if (!t->is_object()) throw UsageError(str(path, ": 'training' must be an object or null"));
  return parse_record(*t, path + ": training");
}

std::string describe_weights(const WeightPolicy& p) {
  std::string out = p.format;
  std::vector<std::string> keys;
  if (p.format == "nf4") {
    keys.push_back(str("quant_blocksize ", p.blocksize));
    keys.push_back(str("double_quant ", p.double_quant ? "true" : "false"));
  }
  if (!p.skip_modules.empty()) keys.push_back(str("skip_modules [", join(p.skip_modules, ", "), "]"));
  return keys.empty() ? out : str(out, " (", join(keys, ", "), ")");
}

bool same_weights(const WeightPolicy& a, const WeightPolicy& b) {
  if (a.format != b.format) return false;
  if (std::set<std::string>(a.skip_modules.begin(), a.skip_modules.end()) !=
      std::set<std::string>(b.skip_modules.begin(), b.skip_modules.end()))
    return false;
  return a.format != "nf4" || (a.blocksize == b.blocksize && a.double_quant == b.double_quant);
}

MergePlan plan_merge(const std::string& model_dir, const std::string& adapter_dir,
                     const std::optional<WeightPolicy>& explicit_weights) {
  MergePlan plan;
  plan.record = read_training_record(adapter_dir);
  const std::string record_file = (fs::path(adapter_dir) / kTrainingRecordFile).string();
  plan.model_dir = model_dir;
  if (plan.model_dir.empty() && plan.record) plan.model_dir = plan.record->base_model;
  if (plan.model_dir.empty())
    throw UsageError("merge-lora: --model is required (or a --config with model.path, or an adapter whose "
                     "axengine_training.json names its base)");
  if (plan.record && !plan.record->base_model.empty() && absolute(plan.model_dir) != absolute(plan.record->base_model))
    log::info(str("merge-lora: the adapter was trained on ", plan.record->base_model, "; merging it into ", plan.model_dir));
  if (plan.record) {
    if (explicit_weights && !same_weights(*explicit_weights, plan.record->weights))
      throw UsageError(str("merge-lora: ", record_file, " says the adapter was trained with weight_format ",
                           describe_weights(plan.record->weights), ", but --config gives ", describe_weights(*explicit_weights),
                           ": merged onto another base than the one it learned against, it would be another model. "
                           "Leave --config out (the record is used) or give the config the adapter was trained with"));
    plan.weights = plan.record->weights;
    if (!explicit_weights && plan.weights.format != "dense")
      log::info(str("merge-lora: the base is packed as the adapter was trained (", record_file, "): ",
                    describe_weights(plan.weights), ", then dequantised"));
  } else {
    plan.weights = explicit_weights.value_or(WeightPolicy{});
    if (!explicit_weights)
      log::warn(str("merge-lora: ", adapter_dir, " has no ", kTrainingRecordFile, " (an adapter made elsewhere, or by an "
                    "axengine before training records): the base is merged as stored. An adapter trained on a quantised "
                    "base (QLoRA, [model] weight_format) needs --config with its run's config, or the merge is another model"));
  }
  return plan;
}

void check_trained_base(const std::optional<TrainingRecord>& record, const std::string& adapter_dir,
                        const std::string& model_dir, const std::string& loaded_format, const std::string& command) {
  if (!record || record->base_format == loaded_format) return;
  throw UsageError(str(command, ": the adapter was trained on a base held in ", record->base_format, " (",
                       (fs::path(adapter_dir) / kTrainingRecordFile).string(), ": base ", record->base_model,
                       ", weight_format ", describe_weights(record->weights), "), but ", model_dir, " loads as ",
                       loaded_format, ": give the base it was trained on (a pre-quantised checkpoint's adapter "
                       "belongs on that checkpoint, not on its dense original)"));
}

std::string merge_record_json(const MergePlan& plan, const std::string& adapter_dir, const std::string& base_format,
                              const std::string& dtype) {
  json j = {{"format", "axengine-merge-record-v1"},
            {"base_model", absolute(plan.model_dir)},
            {"adapter", absolute(adapter_dir)},
            {"weights", weights_json(plan.weights)},
            {"base_format", base_format},
            {"dtype", dtype},
            {"axengine_version", kVersion},
            {"training", plan.record ? plan.record->to_json() : json(nullptr)}};
  return j.dump(2) + "\n";
}

std::optional<json> default_template_kwargs(const TrainingRecord& record, std::string& why) {
  why.clear();
  if (record.template_kwargs.empty()) return std::nullopt;
  for (const auto& k : record.template_kwargs)
    if (k != record.template_kwargs.front()) {
      std::vector<std::string> all;
      for (const auto& e : record.template_kwargs) all.push_back(e.dump());
      why = str("the run's chat_template datasets used different template_kwargs (", join(all, ", "), ")");
      return std::nullopt;
    }
  return record.template_kwargs.front();
}

}  // namespace ax::models
