// Which image processor a chat_template row's images go through is the model family's to say: each vision-language
// family's description names a kind (VlDescription::image_processor, models/vlm.hpp), the run hands it to the
// dataset types (DatasetContext::image_processor, from model_image_processor) and mm_cpt implements the kinds
// (ChatImageSupport, chat_images.cpp) without reading a model_type. Here: every description's kind reaches a
// processor of mm_cpt's that works with the family's own tiny model, and a kind no loaded plugin implements is
// refused naming the model_type and the kind.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "axengine/hf_tokenizer.hpp"
#include "axengine/models.hpp"
#include "axengine/registry.hpp"
#include "data/chat_images.hpp"
#include "data/register.hpp"
#include "models/vlm.hpp"
#include "chat_util.hpp"
#include "e2e_util.hpp"
#include "mm_dataset.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;

namespace {
const std::string kData = MM_CPT_TEST_DATA;
const std::string kModel = kData + "/chat/model";  // a qwen2_5_vl
}  // namespace

TEST_CASE("chat images: every vision-language family's description names a processor kind mm_cpt implements, which processes its model's images") {
  const ax::mm::MmCptType mm;
  const std::vector<std::string> kinds = mm.chat_image_processors();
  REQUIRE(!ax::models::vl_descriptions().empty());
  for (const ax::models::VlDescription* d : ax::models::vl_descriptions()) {
    CAPTURE(d->family);
    CHECK(std::find(kinds.begin(), kinds.end(), d->image_processor) != kinds.end());
    // The family's tiny model: the run finds the kind from its config.json, core finds mm_cpt's processor of that
    // kind among the registry's dataset types, and the processor reads the model's own tokenizer and files.
    const fs::path dir = mm_e2e::scratch("mm_chat_kinds", d->preset);
    d->init_preset(dir.string(), 1);
    const std::string kind = ax::model_image_processor(dir.string());
    CHECK(kind == d->image_processor);
    auto tok = ax::load_hf_tokenizer(dir.string());
    const ax::DatasetContext ctx{tok.get(), (dir / "run.toml").string(), dir.string(), dir.string(), kind};
    const ax::data::ImageSetup setup = ax::data::find_image_processor(&mm_chat::registry(), ax::ChatImageOptions{}, ctx);
    CAPTURE(setup.why);
    REQUIRE(setup.processor);
    // Its tokens are the model's: the marker and every image token are single tokens of the family's tokenizer
    // (a processor of another kind asks for tokens this tokenizer splits, and cannot start).
    CHECK(tok->encode(setup.processor->image_marker(), false).size() == 1);
    const std::vector<int32_t> ids = setup.processor->image_token_ids();
    CHECK(!ids.empty());
    const std::string image = kData + "/images/b.png";
    const std::vector<int32_t> expanded = tok->encode(setup.processor->expand(image), false);
    CHECK(std::count_if(expanded.begin(), expanded.end(), [&](int32_t t) { return std::find(ids.begin(), ids.end(), t) != ids.end(); }) > 1);
    ax::Sample s;
    setup.processor->add_extras({image}, s);
    CHECK(s.extras.count("pixel_values") == 1);
    fs::remove_all(dir);
  }
  // A text-only family names none: its rows with images are refused (chat_test.cpp).
  const fs::path text = mm_e2e::scratch("mm_chat_kinds", "text");
  ax::init_model_dir("tiny-qwen3", text.string(), 1);
  CHECK(ax::model_image_processor(text.string()).empty());
  fs::remove_all(text);
}

TEST_CASE("chat images: a processor kind no loaded plugin implements is refused, naming the model_type and the kind") {
  auto dir = mm_e2e::corpus("mm_chat_kinds", "unknown", R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "?"}]}, {"role": "assistant", "content": "x"}]}
)");
  auto tok = ax::load_hf_tokenizer(kModel);
  const auto open = [&](const ax::Registry& registry, const std::string& kind) {
    auto type = registry.get<ax::DatasetType>(ax::ProviderKind::dataset, "chat_template");
    type->open(toml::parse("type = \"chat_template\"\npath = \"data.jsonl\"\n"),
               ax::DatasetContext{tok.get(), (dir / "run.toml").string(), dir.string(), kModel, kind});
  };
  // mm_cpt loaded, a kind it does not implement (as a family description naming a processor of a plugin not built).
  std::string e = mm_e2e::error_of([&] { open(mm_chat::registry(), "no_such_processor"); });
  CAPTURE(e);
  CHECK(e.find("data.jsonl:1: message 0") != std::string::npos);
  CHECK(e.find("no loaded plugin implements image processor 'no_such_processor'") != std::string::npos);
  CHECK(e.find("model_type 'qwen2_5_vl'") != std::string::npos);
  CHECK(e.find("the loaded plugins implement qwen2_vl, gemma3") != std::string::npos);
  // Without the plugin (the built-in dataset types only), the model's own kind.
  ax::Registry builtins;
  ax::data::register_builtin_datasets(builtins);
  e = mm_e2e::error_of([&] { open(builtins, ax::model_image_processor(kModel)); });
  CHECK(e.find("no loaded plugin implements image processor 'qwen2_vl'") != std::string::npos);
  CHECK(e.find("no loaded plugin processes images (the mm_cpt plugin does)") != std::string::npos);
  // The same kind with mm_cpt loaded: the row is read.
  CHECK(mm_e2e::error_of([&] { open(mm_chat::registry(), ax::model_image_processor(kModel)); }).empty());
  fs::remove_all(dir);
}
