// `alpaca`: instruction-following rows in the Stanford Alpaca layout, formatted with its prompt template.
//   {"instruction": "Add the numbers.", "input": "12, 35", "output": "47"}
// becomes the prompt (no loss)
//   Below is an instruction that describes a task, paired with an input that provides further context. Write a
//   response that appropriately completes the request.\n\n### Instruction:\nAdd the numbers.\n\n### Input:\n12, 35\n\n### Response:\n
// followed by the output (trained on) and EOS. A row whose input is empty, null or absent takes the template's
// no-input form ("Below is an instruction that describes a task. Write a response ...\n\n### Instruction:\n...\n\n
// ### Response:\n"). The strings are axolotl's `alpaca` prompt style (and Unsloth's); the original Stanford
// train.py writes the same text without the newline after "### Response:".
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

const char* const kAlpacaPromptInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";
const char* const kAlpacaPromptNoInput =
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n";

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  std::string out = input.empty() ? kAlpacaPromptNoInput : kAlpacaPromptInput;
  // Substituted once each, left to right, so braces inside the user's text are never read as placeholders.
  auto put = [&](const std::string& key, const std::string& value, std::size_t from) {
    const std::size_t at = out.find(key, from);
    out.replace(at, key.size(), value);
    return at + value.size();
  };
  const std::size_t next = put("{instruction}", instruction, 0);
  if (!input.empty()) put("{input}", input, next);
  return out;
}

namespace {

struct AlpacaOptions {
  std::string instruction_field = "instruction";
  std::string input_field = "input";
  std::string output_field = "output";
  bool add_bos = true;
  bool add_eos = true;
};

// `shared`: also the keys completion has too (add_bos, add_eos), which the reference lists once, under completion.
void bind_alpaca(TableBinder& t, AlpacaOptions& o, bool shared = true) {
  t.field("instruction_field", o.instruction_field, "alpaca: field holding the instruction (part of the prompt, no loss)");
  t.field("input_field", o.input_field, "alpaca: field holding the optional input; empty, null or absent in a row selects the no-input prompt (\"\" = rows have none)");
  t.field("output_field", o.output_field, "alpaca: field holding the response to train on");
  if (!shared) return;
  t.field("add_bos", o.add_bos, "alpaca: start each sample with the tokenizer's BOS token (when it has one)");
  t.field("add_eos", o.add_eos, "alpaca: end each sample with the tokenizer's EOS token, so the model learns to stop");
}

class AlpacaType final : public DatasetType {
 public:
  std::vector<std::string> known_keys() const override {
    auto keys = common_dataset_keys();
    for (const char* k : {"instruction_field", "input_field", "output_field", "add_bos", "add_eos"}) keys.push_back(k);
    return keys;
  }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    if (!ctx.tokenizer) throw RuntimeError("alpaca dataset opened without a tokenizer");
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    CommonEntry common = read_common_entry(t, ctx);
    AlpacaOptions o;
    bind_alpaca(t, o);
    t.finish();
    for (const char* k : {"instruction_field", "output_field"})
      if (const auto* v = entry.get(k); v && v->value_or(std::string()).empty()) t.fail(v, ax::str("'", k, "' is empty"));

    auto check = [&](const nlohmann::json& v) -> std::string {
      for (const std::string* f : {&o.instruction_field, &o.output_field}) {
        auto it = v.find(*f);
        if (it == v.end()) return ax::str("field '", *f, "' is missing");
        if (!it->is_string()) return ax::str("field '", *f, "' must be a string");
      }
      if (!o.input_field.empty())
        if (auto it = v.find(o.input_field); it != v.end() && !it->is_string() && !it->is_null())
          return ax::str("field '", o.input_field, "' must be a string (or null)");
      return "";
    };
    auto contents = read_rows(common.path, common.split, parse_bad_row_policy(common.on_bad_row), check);
    auto ds = std::make_shared<PromptCompletionDataset>(*ctx.tokenizer, o.add_bos, o.add_eos);
    ds->skipped_ = contents.skipped;
    ds->sources_.files = contents.files;
    for (auto& row : contents.rows) {
      const auto& v = row.value;
      std::string input;
      if (!o.input_field.empty())
        if (auto it = v.find(o.input_field); it != v.end() && it->is_string()) input = it->get<std::string>();
      ds->prompts_.push_back(alpaca_prompt(v[o.instruction_field].get<std::string>(), input));
      ds->texts_.push_back(v[o.output_field].get<std::string>());
      ds->sources_.origins.push_back(row.origin);
    }
    return ds;
  }
};

}  // namespace

std::shared_ptr<DatasetType> make_alpaca_type() { return std::make_shared<AlpacaType>(); }

void document_alpaca_keys(TableBinder& t, bool shared) {
  AlpacaOptions o;
  bind_alpaca(t, o, shared);
}

}  // namespace ax::data
