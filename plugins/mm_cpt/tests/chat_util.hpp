// What the chat_template-with-images tests share: the dataset registry as `axengine run` has it, opening a
// chat_template dataset over a data dir with a model dir's tokenizer and processor, and the walk of the committed
// conversations (openai.jsonl, then sharegpt.jsonl) against transformers' goldens.jsonl.
#pragma once
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/hf_tokenizer.hpp"
#include "axengine/models.hpp"
#include "axengine/registry.hpp"
#include "data/register.hpp"
#include "mm_dataset.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace mm_chat {

// The built-in dataset types and mm_cpt's, as `axengine run` has them.
inline const ax::Registry& registry() {
  static ax::Registry reg = [] {
    ax::Registry r;
    ax::data::register_builtin_datasets(r);
    ax::mm::add_mm_cpt_type(r);
    return r;
  }();
  return reg;
}

// A chat_template dataset of `toml` whose paths are relative to `base`, with `model`'s processor (the kind its
// family's description names, as `axengine run` finds it) and `tok`.
inline std::shared_ptr<ax::Dataset> open(const std::string& toml, const std::string& base, const ax::Tokenizer& tok,
                                         const std::string& model) {
  auto type = registry().get<ax::DatasetType>(ax::ProviderKind::dataset, "chat_template");
  return type->open(toml::parse(toml), ax::DatasetContext{&tok, base + "/run.toml", base, model, ax::model_image_processor(model)});
}

inline const char* const kShareGpt = "field_messages = \"conversations\"\nmessage_field_role = \"from\"\n"
                                     "message_field_content = \"value\"\nroles = { human = \"user\", gpt = \"assistant\" }\n";

// Every committed conversation of `data_dir` (openai.jsonl, then sharegpt.jsonl) through `model`'s chat template and
// processor: ids and labels equal goldens.jsonl of `goldens_dir` row by row; `extras` checks a row's media against
// its golden and returns how many images it had.
inline void check_goldens(const std::string& data_dir, const std::string& goldens_dir, const std::string& model,
                          const std::function<int64_t(const ax::Sample&, const nlohmann::json&)>& extras) {
  std::vector<nlohmann::json> goldens;
  {
    std::ifstream in(goldens_dir + "/goldens.jsonl");
    for (std::string l; std::getline(in, l);) goldens.push_back(nlohmann::json::parse(l));
  }
  REQUIRE(goldens.size() >= 50);
  auto tok = ax::load_hf_tokenizer(model);
  auto openai = open("type = \"chat_template\"\npath = \"openai.jsonl\"\n", data_dir, *tok, model);
  auto share = open(std::string("type = \"chat_template\"\npath = \"sharegpt.jsonl\"\n") + kShareGpt, data_dir, *tok, model);
  REQUIRE(openai->size() + share->size() == goldens.size());
  int64_t images = 0, text_only = 0;
  std::size_t k = 0;
  for (const auto* ds : {openai.get(), share.get()})
    for (std::size_t i = 0; i < ds->size(); ++i, ++k) {
      CAPTURE(k);
      const ax::Sample s = ds->get(i);
      CHECK(s.input_ids == goldens[k]["input_ids"].get<std::vector<int32_t>>());
      CHECK(s.labels == goldens[k]["labels"].get<std::vector<int32_t>>());
      const int64_t n = extras(s, goldens[k]);
      if (n == 0) CHECK(s.extras.empty());  // a text-only row carries no media
      images += n;
      text_only += n == 0;
    }
  CHECK(images >= 50);
  CHECK(text_only > 0);
}

}  // namespace mm_chat
