// JSONL rows of the `chat_template` dataset type (a messages list per row, OpenAI or ShareGPT keys), rendered with a
// real chat template and labelled: the row checks, the role mapping, the message pass-through into the Jinja
// context, the span rule and encode_with_offsets on whatever text the rows make the template write.
//
// First byte: bit 0 skip bad rows, bit 1 ShareGPT keys (conversations / from / value, human -> user, gpt ->
// assistant), bits 2-3 train_on (assistant, all, last, assistant), bit 4 the {% generation %} template
// (chatml-generation; else Qwen2.5's, which the span rule serves), bit 5 the tools column. The rest is the file.
#include <cstdlib>

#include "axengine/error.hpp"
#include "dataset_rows.hpp"

AX_FUZZ_HARNESS(dataset_chat) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  static const auto type = ax::data::make_chat_template_type();
  if (size == 0) return;
  const std::uint8_t flags = data[0];
  const std::string path = ax::fuzz::scratch() + "/rows.jsonl";
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data + 1), size - 1});
  const std::string templates = std::string(AXENGINE_TEST_DATA_DIR) + "/chat_templates/";
  toml::table entry{{"type", "chat_template"}, {"path", path},
                    {"chat_template", templates + ((flags & 16) ? "chatml-generation.jinja" : "Qwen-Qwen2.5-7B-Instruct.jinja")}};
  ax::fuzz::add_chat_options(entry, flags);
  if (flags & 32) entry.insert("field_tools", "tools");
  const ax::Tokenizer& tok = ax::fuzz::dataset_tokenizer();
  ax::DatasetContext ctx{&tok, "fuzz.toml", ax::fuzz::scratch(), ""};
  auto ds = type->open(entry, ctx);
  const int64_t vocab = tok.vocab_size();
  for (std::size_t i = 0; i < ds->size(); ++i) {
    ax::Sample s;
    try {
      s = ds->get(i);
    } catch (const ax::UsageError&) {
      continue;  // a row the template refuses, or whose assistant content it rewrites: named and refused
    }
    if (s.input_ids.size() != s.labels.size()) std::abort();
    for (std::size_t k = 0; k < s.input_ids.size(); ++k) {
      if (s.input_ids[k] < 0 || s.input_ids[k] >= vocab) std::abort();
      if (s.labels[k] != -100 && s.labels[k] != s.input_ids[k]) std::abort();  // labels are the ids they train on
    }
  }
}
