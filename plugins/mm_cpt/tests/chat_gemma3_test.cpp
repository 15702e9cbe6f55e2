// Images in core's chat_template rows for Gemma 3 (docs/datasets.md, "Images in conversations"): ids and label
// masks equal to transformers' Gemma3Processor + chat template on the committed conversations
// (scripts/goldens/make_gemma3_chat_goldens.py), pixel parity of the C++ processor with transformers' fast
// Gemma3ImageProcessor on the committed images, and the processor settings refused by name.
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/registry.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "chat_util.hpp"
#include "image.hpp"
#include "mm_dataset.hpp"
#include "processor.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kData = MM_CPT_TEST_DATA;
const std::string kChat = kData + "/chat_gemma3";
const std::string kModel = kChat + "/model";

const ax::Tokenizer& tokenizer() {
  static auto tok = ax::load_hf_tokenizer(kModel);
  return *tok;
}

std::shared_ptr<ax::Dataset> open(const std::string& toml, const std::string& model = kModel) {
  return mm_chat::open(toml, kChat, tokenizer(), model);
}

}  // namespace

TEST_CASE("chat_template with images: ids and labels equal transformers' Gemma3Processor + chat template") {
  mm_chat::check_goldens(kChat, kChat, kModel, [](const ax::Sample& s, const json& golden) -> int64_t {
    const int64_t n = golden["n_images"].get<int64_t>();
    if (n > 0) CHECK((s.extras.at("pixel_values").sizes() == at::IntArrayRef{n, 3, 16, 16}));
    return n;
  });
}

TEST_CASE("gemma3 image processor: pixels equal transformers' fast Gemma3ImageProcessor") {
  auto golden = ax::safetensors::File::open(kChat + "/pixels.safetensors");
  ax::mm::Gemma3ProcessorConfig pc;
  pc.height = pc.width = 16;
  int checked = 0;
  for (const auto& t : golden->tensors()) {
    const std::string file = t.name.substr(std::string("pixel_values.").size());
    CAPTURE(file);
    at::Tensor ours = ax::mm::process_gemma3_image(ax::mm::decode_image_file(kData + "/images/" + file, {}), pc);
    CHECK((ours - golden->get(t.name)).abs().max().item<double>() <= 1e-6);
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("gemma3 image processor: settings it does not implement are refused by name") {
  const fs::path dir = fs::temp_directory_path() / ax::str("ax_gemma3_proc_", ::getpid());
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) fs::copy_file(fs::path(kModel) / f, dir / f, fs::copy_options::overwrite_existing);
  auto refused = [&](const json& pre, const std::string& what) {
    CAPTURE(what);
    std::ofstream(dir / "preprocessor_config.json") << pre.dump();
    std::string err;
    try {
      open("type = \"chat_template\"\npath = \"openai.jsonl\"\n", dir.string());
    } catch (const ax::UsageError& e) {
      err = e.what();
    }
    CHECK(err.find(what) != std::string::npos);
  };
  refused({{"size", {{"height", 16}, {"width", 16}}}, {"do_pan_and_scan", true}}, "'do_pan_and_scan' true is not supported");
  refused({{"size", {{"height", 16}, {"width", 16}}}, {"resample", 3}}, "'resample' 3 is not supported");
  refused({{"size", {{"height", 32}, {"width", 32}}}}, "resizes to 32x32 but the vision tower takes 16x16");
  std::ofstream(dir / "preprocessor_config.json") << json{{"size", {{"height", 16}, {"width", 16}}}}.dump();
  std::string err;
  try {
    open("type = \"chat_template\"\npath = \"openai.jsonl\"\nmax_pixels = 1000\n", dir.string());
  } catch (const ax::UsageError& e) {
    err = e.what();
  }
  CHECK(err.find("do not apply to gemma3") != std::string::npos);
  fs::remove_all(dir);
}
