// The chat_template dataset type against transformers (scripts/goldens/make_chat_dataset_goldens.py): the samples of
// real templates with committed tokenizers equal transformers' apply_chat_template(..., return_assistant_tokens_mask)
// (chatml-generation) or its rendering + HF tokenizers' offsets + the documented span rule (the others); and
// encode_with_offsets equals HF tokenizers' offsets.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/stream.hpp"
#include "data/types.hpp"
#include "unit/test_util.hpp"

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(AXENGINE_TEST_DATA_DIR) + "/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return nlohmann::json::parse(in);
}

// Whether the tokenizer's normalizer leaves the text as it is: where encode_with_offsets promises HF's offsets.
// The others rewrite it (NFD + Strip, NFKD + Strip, Replace + Strip, Llama 2's Prepend + Replace of spaces by U+2581,
// where a lone U+2581 token's offsets differ from HF's by a character).
bool exact_offsets_expected(const std::string& tokenizer) {
  return tokenizer != "gpt2_bytelevel_variant" && tokenizer != "metaspace_split_variant" &&
         tokenizer != "split_behaviors_variant" && tokenizer != "llama2_metaspace";
}

}  // namespace

TEST_CASE("encode_with_offsets: the ids of encode and HF tokenizers' offsets on every committed tokenizer") {
  const auto golden = read_json(kData + "tokenizers/offsets.json");
  int compared = 0;
  for (const auto& [name, cases] : golden.items()) {
    auto tok = ax::load_hf_tokenizer(kData + "tokenizers/" + name);
    for (const auto& c : cases) {
      const std::string text = c["text"];
      std::vector<std::pair<std::size_t, std::size_t>> offsets;
      auto ids = ax::encode_with_offsets(*tok, text, offsets);
      CAPTURE(name);
      CAPTURE(text);
      CHECK(ids == tok->encode(text, false));
      CHECK(ids == c["ids"].get<std::vector<int32_t>>());
      REQUIRE(offsets.size() == ids.size());
      for (std::size_t k = 0; k < offsets.size(); ++k) {
        CHECK(offsets[k].first <= offsets[k].second);
        CHECK(offsets[k].second <= text.size());
        if (k) CHECK(offsets[k].first >= offsets[k - 1].first);
      }
      if (!exact_offsets_expected(name)) continue;
      std::vector<std::pair<std::size_t, std::size_t>> want;
      for (const auto& o : c["offsets"]) want.emplace_back(o[0].get<std::size_t>(), o[1].get<std::size_t>());
      CHECK(offsets == want);
      ++compared;
    }
  }
  CHECK(compared >= 50);  // 6 tokenizers x 9 texts
}

TEST_CASE("chat_template dataset: samples equal transformers' (generation mask) and the span rule's goldens") {
  const std::map<std::string, std::string> pairs{
      {"chatml-generation", "qwen2_bytelevel"}, {"Qwen-Qwen3-0.6B", "qwen2_bytelevel"},
      {"Qwen-Qwen2.5-7B-Instruct", "qwen2_bytelevel"}, {"meta-llama-Llama-3.1-8B-Instruct", "llama3_bytelevel"},
      {"meta-llama-Llama-3.2-3B-Instruct", "llama3_bytelevel"}, {"google-gemma-3-it", "qwen2_bytelevel"},
      {"mistralai-Mistral-Nemo-Instruct-2407", "transformers_llama"}};
  auto type = ax::data::make_chat_template_type();
  int samples = 0, refusals = 0, streamed = 0;
  for (const auto& [tmpl, tokname] : pairs) {
    ax_test::TempDir dir;
    const std::string model = dir / "model";
    fs::create_directories(model);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(kData + "tokenizers/" + tokname + "/" + f, model + "/" + f);
    fs::copy_file(kData + "chat_templates/" + tmpl + ".jinja", model + "/chat_template.jinja");
    auto tok = ax::load_hf_tokenizer(model);
    // Rows with the same template kwargs go into one file (kwargs are per dataset entry).
    std::map<std::string, std::vector<nlohmann::json>> groups;
    std::ifstream in(kData + "chat_templates/dataset_goldens/" + tmpl + ".jsonl");
    for (std::string line; std::getline(in, line);) {
      auto row = nlohmann::json::parse(line);
      groups[row["kwargs"].dump()].push_back(row);
    }
    REQUIRE(!groups.empty());
    int group = 0;
    for (const auto& [kwargs, rows] : groups) {
      const std::string data = dir / ("data" + std::to_string(group++) + ".jsonl");
      std::string text;
      for (const auto& r : rows) text += nlohmann::json{{"messages", r["messages"]}, {"tools", r["tools"]}}.dump() + "\n";
      ax_test::write_file(data, text);
      std::string entry = "type = \"chat_template\"\npath = \"" + data + "\"\nfield_tools = \"tools\"\n";
      auto kw = nlohmann::json::parse(kwargs);
      if (!kw.empty()) {
        entry += "[template_kwargs]\n";
        for (const auto& [k, v] : kw.items()) entry += k + " = " + v.dump() + "\n";
      }
      auto table = toml::parse(entry);
      ax::DatasetContext ctx{tok.get(), "run.toml", dir.path.string(), model};
      auto ds = type->open(table, ctx);
      REQUIRE(ds->size() == rows.size());
      // streaming = true reads the same rows lazily: the same samples (or the same refusal), in order.
      auto stream = dynamic_cast<const ax::StreamingDatasetType&>(*type).open_stream(table, ctx);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        CAPTURE(tmpl);
        ax::Sample s;
        if (rows[i].value("error", false)) {
          CHECK_THROWS_WITH_AS(stream->next(s), doctest::Contains("its content is not in the rendered text"), ax::UsageError);
          continue;
        }
        REQUIRE(stream->next(s));
        CHECK(s.input_ids == rows[i]["input_ids"].get<std::vector<int32_t>>());
        CHECK(s.labels == rows[i]["labels"].get<std::vector<int32_t>>());
        ++streamed;
      }
      for (std::size_t i = 0; i < rows.size(); ++i) {
        CAPTURE(tmpl);
        CAPTURE(rows[i]["messages"].dump());
        if (rows[i].value("error", false)) {
          CHECK_THROWS_WITH_AS(ds->get(i), doctest::Contains("its content is not in the rendered text"), ax::UsageError);
          ++refusals;
          continue;
        }
        auto s = ds->get(i);
        CHECK(s.input_ids == rows[i]["input_ids"].get<std::vector<int32_t>>());
        CHECK(s.labels == rows[i]["labels"].get<std::vector<int32_t>>());
        ++samples;
      }
    }
  }
  CHECK(samples >= 200);
  CHECK(refusals >= 10);
  CHECK(streamed == samples);
}
