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
#include "data/prompt_dataset.hpp"
#include "data/types.hpp"

namespace ax::data {
namespace {

// Rows shaped like another type's, so that "field 'text' is missing" says which type reads them.
std::string shape_hint(const nlohmann::json& v) {
  if (v.contains("instruction") && v.contains("output")) return " (rows with 'instruction' and 'output' are type = \"alpaca\")";
  if (v.contains("messages") || v.contains("conversations"))
    return " (rows holding a conversation are type = \"chat_template\")";
  if (v.contains("input_ids")) return " (rows of token ids are type = \"pretokenized\")";
  return "";
}

struct CompletionOptions {
  std::string text_field = "text";
  std::string prompt_field;
  bool add_bos = true;
  bool add_eos = true;
};

void bind_completion(TableBinder& t, CompletionOptions& o) {
  t.field("text_field", o.text_field, "completion: JSON field holding the text to train on");
  t.field("prompt_field", o.prompt_field, "completion: JSON field holding a prompt that precedes the text and gets no loss (\"\" = none)");
  t.field("add_bos", o.add_bos, "completion, alpaca: start each sample with the tokenizer's BOS token (when it has one)");
  t.field("add_eos", o.add_eos, "completion, alpaca: end each sample with the tokenizer's EOS token, so the model learns to stop");
}

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

    auto ds = std::make_shared<PromptCompletionDataset>(*ctx.tokenizer, o.add_bos, o.add_eos);
    auto check = [&](const nlohmann::json& v) -> std::string {
      auto it = v.find(o.text_field);
      if (it == v.end()) return ax::str("field '", o.text_field, "' is missing", shape_hint(v));
      if (!it->is_string()) return ax::str("field '", o.text_field, "' must be a string");
      if (!o.prompt_field.empty()) {
        auto p = v.find(o.prompt_field);
        if (p == v.end()) return ax::str("field '", o.prompt_field, "' is missing");
        if (!p->is_string()) return ax::str("field '", o.prompt_field, "' must be a string");
      }
      return "";
    };
    auto contents = read_rows(common.path, parse_bad_row_policy(common.on_bad_row), check);
    ds->skipped_ = contents.skipped;
    ds->sources_.files = contents.files;
    for (auto& row : contents.rows) {
      ds->texts_.push_back(row.value[o.text_field].get<std::string>());
      ds->sources_.origins.push_back(row.origin);
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
