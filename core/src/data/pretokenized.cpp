// `pretokenized`: rows that are already token ids.
//   {"input_ids": [1, 5, 9], "labels": [-100, 5, 9], "attention_mask": [1, 1, 1]}
// labels and attention_mask are optional (the *_field keys name other columns); every id must lie within the tokenizer's vocabulary, lists must
// have equal lengths, and positions with attention_mask 0 (padding) are dropped: the engine packs itself.
#include <memory>

#include "axengine/dataset.hpp"
#include "axengine/error.hpp"
#include "axengine/stream.hpp"
#include "axengine/strings.hpp"
#include "axengine/tokenizer.hpp"
#include "data/entry.hpp"
#include "data/jsonl.hpp"
#include "data/types.hpp"

namespace ax::data {
namespace {

class PretokenizedDataset final : public Dataset, public RowLines {
 public:
  std::size_t size() const override { return samples_.size(); }
  std::size_t skipped_rows() const override { return skipped_; }
  const RowSources& row_sources() const override { return sources_; }
  Sample get(std::size_t i) const override { return samples_[i]; }

  std::vector<Sample> samples_;
  RowSources sources_;
  std::size_t skipped_ = 0;
};

// "" when `v` is a list of integers each in [lo, hi) (or == allowed_extra), else what is wrong.
std::string check_ids(const nlohmann::json& v, const char* field, int64_t lo, int64_t hi, int64_t allowed_extra) {
  if (!v.is_array()) return ax::str("'", field, "' must be a list of integers");
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& x = v[i];
    if (!x.is_number_integer()) return ax::str("'", field, "'[", i, "] is not an integer");
    int64_t id = x.get<int64_t>();
    if (id == allowed_extra) continue;
    if (id < lo || id >= hi) return ax::str("'", field, "'[", i, "] = ", id, " is outside the vocabulary [", lo, ", ", hi, ")");
  }
  return "";
}

struct PretokenizedOptions {
  std::string input_ids_field = "input_ids";
  std::string labels_field = "labels";
  std::string attention_mask_field = "attention_mask";
};

void bind_pretokenized(TableBinder& t, PretokenizedOptions& o) {
  t.field("input_ids_field", o.input_ids_field, "pretokenized: field holding the token ids");
  t.field("labels_field", o.labels_field, "pretokenized: field holding the labels (-100 = no loss), optional in a row (absent: the ids; \"\" = never read)");
  t.field("attention_mask_field", o.attention_mask_field, "pretokenized: field holding the attention mask (0 = padding, dropped), optional in a row (\"\" = never read)");
}

class PretokenizedType final : public DatasetType, public StreamingDatasetType {
 public:
  std::vector<std::string> known_keys() const override {
    auto keys = common_dataset_keys();
    for (const char* k : {"input_ids_field", "labels_field", "attention_mask_field"}) keys.push_back(k);
    return keys;
  }

  // Streaming: the same checks and the same sample per row as open(), row by row from the JSON Lines shards.
  std::unique_ptr<SampleStream> open_stream(const toml::table& entry, const DatasetContext& ctx) const override {
    std::function<std::string(const nlohmann::json&)> check;
    std::function<Sample(const nlohmann::json&)> convert;
    CommonEntry common = bind(entry, ctx, check, convert);
    return make_jsonl_stream(stream_shards(common.path), parse_bad_row_policy(common.on_bad_row) == BadRowPolicy::skip,
                             [check, convert](const nlohmann::json& v, const std::string&) {
                               if (std::string e = check(v); !e.empty()) throw UsageError(e);
                               Sample s = convert(v);
                               if (s.input_ids.empty()) throw UsageError("the attention mask masks out every token");  // as open()
                               return s;
                             });
  }

  // Reads the entry's keys; `check` says what is wrong with a row ("" = usable), `convert` makes a checked row's
  // sample (empty when its mask drops every token).
  CommonEntry bind(const toml::table& entry, const DatasetContext& ctx, std::function<std::string(const nlohmann::json&)>& check_out,
                   std::function<Sample(const nlohmann::json&)>& convert_out) const {
    if (!ctx.tokenizer) throw RuntimeError("pretokenized dataset opened without a tokenizer");
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    CommonEntry common = read_common_entry(t, ctx);
    PretokenizedOptions o;
    bind_pretokenized(t, o);
    t.finish();
    if (o.input_ids_field.empty()) t.fail(entry.get("input_ids_field"), "'input_ids_field' is empty");
    const std::string id_field = o.input_ids_field;
    const int64_t vocab = ctx.tokenizer->vocab_size();
    // A row's optional column, or null when absent or not read ("" field).
    auto optional = [](const nlohmann::json& v, const std::string& field) -> const nlohmann::json* {
      if (field.empty()) return nullptr;
      auto it = v.find(field);
      return it == v.end() || it->is_null() ? nullptr : &*it;  // null: a Parquet column without a value here
    };
    auto check = [id_field, o, vocab, optional](const nlohmann::json& v) -> std::string {  // outlives this call
      auto ids = v.find(id_field);
      if (ids == v.end()) return ax::str("'", id_field, "' is missing");
      if (auto e = check_ids(*ids, id_field.c_str(), 0, vocab, INT64_MIN); !e.empty()) return e;
      if (ids->empty()) return ax::str("'", id_field, "' is empty");
      for (const std::string* f : {&o.labels_field, &o.attention_mask_field}) {
        const nlohmann::json* it = optional(v, *f);
        if (!it) continue;
        const bool mask = f == &o.attention_mask_field;
        if (auto e = check_ids(*it, f->c_str(), 0, mask ? 2 : vocab, mask ? INT64_MIN : -100); !e.empty()) return e;
        if (it->size() != ids->size())
          return ax::str("'", *f, "' has ", it->size(), " entries but '", id_field, "' has ", ids->size());
      }
      return "";
    };
    check_out = check;
    convert_out = [id_field, o, optional](const nlohmann::json& v) {
      auto ids = v[id_field].get<std::vector<int32_t>>();
      const nlohmann::json* l = optional(v, o.labels_field);
      const nlohmann::json* m = optional(v, o.attention_mask_field);
      auto labels = l ? l->get<std::vector<int32_t>>() : ids;
      std::vector<int32_t> mask = m ? m->get<std::vector<int32_t>>() : std::vector<int32_t>(ids.size(), 1);
      Sample s;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (!mask[i]) continue;
        s.input_ids.push_back(ids[i]);
        s.labels.push_back(labels[i]);
      }
      return s;
    };
    return common;
  }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    std::function<std::string(const nlohmann::json&)> check;
    std::function<Sample(const nlohmann::json&)> convert;
    CommonEntry common = bind(entry, ctx, check, convert);
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    PretokenizedOptions o;
    bind_pretokenized(t, o);
    auto contents = read_rows(common.path, common.split, parse_bad_row_policy(common.on_bad_row), check);
    auto ds = std::make_shared<PretokenizedDataset>();
    ds->skipped_ = contents.skipped;
    ds->sources_.files = contents.files;
    ds->samples_.reserve(contents.rows.size());
    for (const auto& row : contents.rows) {
      Sample s = convert(row.value);
      if (s.input_ids.empty()) {
        if (parse_bad_row_policy(common.on_bad_row) == BadRowPolicy::error)
          throw UsageError(ax::str(describe_origin(contents.files, row.origin), ": '", o.attention_mask_field,
                                   "' masks out every token"));
        ++ds->skipped_;
        continue;
      }
      ds->samples_.push_back(std::move(s));
      ds->sources_.origins.push_back(row.origin);
    }
    return ds;
  }
};

}  // namespace

std::shared_ptr<DatasetType> make_pretokenized_type() { return std::make_shared<PretokenizedType>(); }
void document_pretokenized_keys(TableBinder& t) {
  PretokenizedOptions o;
  bind_pretokenized(t, o);
}

}  // namespace ax::data
