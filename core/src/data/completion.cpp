// `completion`: rows of text, optionally with a prompt that is fed to the model but not trained on.
//   {"text": "..."}                        -> loss on every token
//   {"prompt": "12+35=", "text": "47"}     -> with prompt_field = "prompt": loss on the answer only
// The prompt-masked form is also what the exact-match eval uses: prompt in, answer out.
#include <memory>

#include "axengine/dataset.hpp"
#include "axengine/error.hpp"
#include "axengine/stream.hpp"
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

class CompletionType final : public DatasetType, public StreamingDatasetType {
 public:
  std::vector<std::string> known_keys() const override {
    auto keys = common_dataset_keys();
    for (const char* k : {"text_field", "prompt_field", "add_bos", "add_eos"}) keys.push_back(k);
    return keys;
  }

  // Streaming: each row checked and tokenised as open() + get() do, as it is read from the JSON Lines shards.
  std::unique_ptr<SampleStream> open_stream(const toml::table& entry, const DatasetContext& ctx) const override {
    CompletionOptions o;
    CommonEntry common = bind(entry, ctx, o);
    const Tokenizer* tok = ctx.tokenizer;
    return make_jsonl_stream(stream_shards(common.path), parse_bad_row_policy(common.on_bad_row) == BadRowPolicy::skip,
                             [o, tok](const nlohmann::json& v, const std::string&) {
                               if (std::string e = check(v, o); !e.empty()) throw UsageError(e);
                               const std::string prompt = o.prompt_field.empty() ? "" : v[o.prompt_field].get<std::string>();
                               return PromptCompletionDataset::make(*tok, o.add_bos, o.add_eos, o.prompt_field.empty() ? nullptr : &prompt,
                                                                    v[o.text_field].get<std::string>());
                             });
  }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    CompletionOptions o;
    CommonEntry common = bind(entry, ctx, o);
    auto ds = std::make_shared<PromptCompletionDataset>(*ctx.tokenizer, o.add_bos, o.add_eos);
    auto contents = read_rows(common.path, common.split, parse_bad_row_policy(common.on_bad_row), [&](const nlohmann::json& v) { return check(v, o); });
    ds->skipped_ = contents.skipped;
    ds->sources_.files = contents.files;
    for (auto& row : contents.rows) {
      ds->texts_.push_back(row.value[o.text_field].get<std::string>());
      ds->sources_.origins.push_back(row.origin);
      if (!o.prompt_field.empty()) ds->prompts_.push_back(row.value[o.prompt_field].get<std::string>());
    }
    return ds;
  }

 private:
  static CommonEntry bind(const toml::table& entry, const DatasetContext& ctx, CompletionOptions& o) {
    if (!ctx.tokenizer) throw RuntimeError("completion dataset opened without a tokenizer");
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    CommonEntry common = read_common_entry(t, ctx);
    bind_completion(t, o);
    t.finish();
    if (o.text_field.empty()) t.fail(entry.get("text_field"), "'text_field' is empty");
    return common;
  }

  // "" for a usable row, else what is wrong with it.
  static std::string check(const nlohmann::json& v, const CompletionOptions& o) {
    auto it = v.find(o.text_field);
    if (it == v.end()) return ax::str("field '", o.text_field, "' is missing", shape_hint(v));
    if (!it->is_string()) return ax::str("field '", o.text_field, "' must be a string");
    if (!o.prompt_field.empty()) {
      auto p = v.find(o.prompt_field);
      if (p == v.end()) return ax::str("field '", o.prompt_field, "' is missing");
      if (!p->is_string()) return ax::str("field '", o.prompt_field, "' must be a string");
    }
    return "";
  }
};

}  // namespace

std::shared_ptr<DatasetType> make_completion_type() { return std::make_shared<CompletionType>(); }

void document_completion_keys(TableBinder& t) {
  CompletionOptions o;
  bind_completion(t, o);
}

}  // namespace ax::data
