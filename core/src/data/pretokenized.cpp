// `pretokenized`: rows that are already token ids.
//   {"input_ids": [1, 5, 9], "labels": [-100, 5, 9], "attention_mask": [1, 1, 1]}
// labels and attention_mask are optional; every id must lie within the tokenizer's vocabulary, lists must
// have equal lengths, and positions with attention_mask 0 (padding) are dropped: the engine packs itself.
#include <memory>

#include "axengine/dataset.hpp"
#include "axengine/error.hpp"
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
  std::size_t row_line(std::size_t i) const override { return lines_[i]; }
  Sample get(std::size_t i) const override { return samples_[i]; }

  std::vector<Sample> samples_;
  std::vector<std::size_t> lines_;
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

class PretokenizedType final : public DatasetType {
 public:
  std::vector<std::string> known_keys() const override { return common_dataset_keys(); }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    if (!ctx.tokenizer) throw RuntimeError("pretokenized dataset opened without a tokenizer");
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    CommonEntry common = read_common_entry(t, ctx);
    t.finish();
    const int64_t vocab = ctx.tokenizer->vocab_size();
    auto check = [&](const nlohmann::json& v) -> std::string {
      auto ids = v.find("input_ids");
      if (ids == v.end()) return "'input_ids' is missing";
      if (auto e = check_ids(*ids, "input_ids", 0, vocab, INT64_MIN); !e.empty()) return e;
      if (ids->empty()) return "'input_ids' is empty";
      for (const char* f : {"labels", "attention_mask"}) {
        auto it = v.find(f);
        if (it == v.end()) continue;
        bool mask = std::string(f) == "attention_mask";
        if (auto e = check_ids(*it, f, 0, mask ? 2 : vocab, mask ? INT64_MIN : -100); !e.empty()) return e;
        if (it->size() != ids->size())
          return ax::str("'", f, "' has ", it->size(), " entries but 'input_ids' has ", ids->size());
      }
      return "";
    };
    auto contents = read_jsonl(common.path, parse_bad_row_policy(common.on_bad_row), check);
    auto ds = std::make_shared<PretokenizedDataset>();
    ds->skipped_ = contents.skipped;
    ds->samples_.reserve(contents.rows.size());
    for (const auto& row : contents.rows) {
      const auto& v = row.value;
      auto ids = v["input_ids"].get<std::vector<int32_t>>();
      auto labels = v.contains("labels") ? v["labels"].get<std::vector<int32_t>>() : ids;
      std::vector<int32_t> mask = v.contains("attention_mask") ? v["attention_mask"].get<std::vector<int32_t>>()
                                                                : std::vector<int32_t>(ids.size(), 1);
      Sample s;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (!mask[i]) continue;
        s.input_ids.push_back(ids[i]);
        s.labels.push_back(labels[i]);
      }
      if (s.input_ids.empty()) {
        if (parse_bad_row_policy(common.on_bad_row) == BadRowPolicy::error)
          throw UsageError(ax::str(common.path, ":", row.line, ": attention_mask masks out every token"));
        ++ds->skipped_;
        continue;
      }
      ds->samples_.push_back(std::move(s));
      ds->lines_.push_back(row.line);
    }
    return ds;
  }
};

}  // namespace

std::shared_ptr<DatasetType> make_pretokenized_type() { return std::make_shared<PretokenizedType>(); }
void document_pretokenized_keys(TableBinder&) {}

}  // namespace ax::data
