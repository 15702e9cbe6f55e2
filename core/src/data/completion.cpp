// `completion`: rows of text, optionally with a prompt that is fed to the model but not trained on.
//   {"text": "..."}                        -> loss on every token
//   {"prompt": "12+35=", "text": "47"}     -> with prompt_field = "prompt": loss on the answer only
// The prompt-masked form is also what the exact-match eval uses: prompt in, answer out.
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

struct CompletionOptions {
  std::string text_field = "text";
  std::string prompt_field;
  bool add_bos = true;
  bool add_eos = true;
};

void bind_completion(TableBinder& t, CompletionOptions& o) {
  t.field("text_field", o.text_field, "completion: JSON field holding the text to train on");
  t.field("prompt_field", o.prompt_field, "completion: JSON field holding a prompt that precedes the text and gets no loss (\"\" = none)");
  t.field("add_bos", o.add_bos, "completion: start each sample with the tokenizer's BOS token (when it has one)");
  t.field("add_eos", o.add_eos, "completion: end each sample with the tokenizer's EOS token, so the model learns to stop");
}

class CompletionDataset final : public Dataset, public RowLines {
 public:
  CompletionDataset(const Tokenizer& tok, const CompletionOptions& o) : tok_(tok), opt_(o) {}

  std::size_t size() const override { return texts_.size(); }
  std::size_t skipped_rows() const override { return skipped_; }
  std::size_t row_line(std::size_t i) const override { return lines_[i]; }

  Sample get(std::size_t i) const override {
    Sample s;
    if (opt_.add_bos && tok_.bos_id() >= 0) s.input_ids.push_back(tok_.bos_id());
    if (!prompts_.empty()) {
      auto p = tok_.encode(prompts_[i]);
      s.input_ids.insert(s.input_ids.end(), p.begin(), p.end());
    }
    std::size_t prompt_len = s.input_ids.size();
    auto t = tok_.encode(texts_[i]);
    s.input_ids.insert(s.input_ids.end(), t.begin(), t.end());
    if (opt_.add_eos && tok_.eos_id() >= 0) s.input_ids.push_back(tok_.eos_id());
    s.labels = s.input_ids;
    for (std::size_t k = 0; k < prompt_len && k < s.labels.size(); ++k) s.labels[k] = -100;
    return s;
  }

  std::vector<std::string> prompts_, texts_;
  std::vector<std::size_t> lines_;
  std::size_t skipped_ = 0;

 private:
  const Tokenizer& tok_;
  CompletionOptions opt_;
};

class CompletionType final : public DatasetType {
 public:
  std::vector<std::string> known_keys() const override {
    auto keys = common_dataset_keys();
    for (const char* k : {"text_field", "prompt_field", "add_bos", "add_eos"}) keys.push_back(k);
    return keys;
  }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    if (!ctx.tokenizer) throw RuntimeError("completion dataset opened without a tokenizer");
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    CommonEntry common = read_common_entry(t, ctx);
    CompletionOptions o;
    bind_completion(t, o);
    t.finish();
    if (o.text_field.empty()) t.fail(entry.get("text_field"), "'text_field' is empty");

    auto ds = std::make_shared<CompletionDataset>(*ctx.tokenizer, o);
    auto check = [&](const nlohmann::json& v) -> std::string {
      auto it = v.find(o.text_field);
      if (it == v.end()) return ax::str("field '", o.text_field, "' is missing");
      if (!it->is_string()) return ax::str("field '", o.text_field, "' must be a string");
      if (!o.prompt_field.empty()) {
        auto p = v.find(o.prompt_field);
        if (p == v.end()) return ax::str("field '", o.prompt_field, "' is missing");
        if (!p->is_string()) return ax::str("field '", o.prompt_field, "' must be a string");
      }
      return "";
    };
    auto contents = read_jsonl(common.path, parse_bad_row_policy(common.on_bad_row), check);
    ds->skipped_ = contents.skipped;
    for (auto& row : contents.rows) {
      ds->texts_.push_back(row.value[o.text_field].get<std::string>());
      ds->lines_.push_back(row.line);
      if (!o.prompt_field.empty()) ds->prompts_.push_back(row.value[o.prompt_field].get<std::string>());
    }
    return ds;
  }
};

}  // namespace

std::shared_ptr<DatasetType> make_completion_type() { return std::make_shared<CompletionType>(); }

void document_completion_keys(TableBinder& t) {
  CompletionOptions o;
  bind_completion(t, o);
}

}  // namespace ax::data
