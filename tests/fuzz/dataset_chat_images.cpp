// chat_template rows with images (core/src/data/chat_images.cpp, chat_template.cpp; the mm_cpt plugin's Qwen2.5-VL
// processor, plugins/mm_cpt/src/chat_images.cpp): content parts, image_url parts, ShareGPT <image> placeholders with
// an images column, rendered with Qwen2.5-VL's chat template, the image markers expanded and the pixels processed.
// Each line is also given to read_chat_images alone, whose result must be self-consistent, and the file is read
// again as a stream (streaming = true), which must give the prepared samples.
//
// First byte: bit 0 skip bad rows, bit 1 ShareGPT keys (conversations / from / value, human -> user, gpt ->
// assistant), bits 2-3 train_on (assistant, all, last, assistant). The rest is the data file; image paths resolve
// against the plugin's committed test images (image_base_dir).
#include <cstdlib>
#include <memory>
#include <sstream>

#include <ATen/ATen.h>
#include <tbb/global_control.h>
#include <toml++/toml.h>

#include "axengine/hf_tokenizer.hpp"
#include "axengine/registry.hpp"
#include "axengine/stream.hpp"
#include "data/chat_images.hpp"
#include "data/register.hpp"
#include "dataset_rows.hpp"
#include "harness.hpp"
#include "mm_dataset.hpp"

namespace {

// read_chat_images on one row alone: on success every image has a message, a local path (no http(s):// or data:
// URL; a file:// prefix is taken off once), and the rewritten
// messages hold exactly that many image parts (no image_url part left, as transformers normalises them).
void check_parser(const std::string& line) {
  nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
  if (!row.is_object()) return;
  auto m = row.find("messages");
  if (m == row.end() || !m->is_array()) return;
  ax::jinja::Json messages = ax::jinja::Json::parse(m->dump());
  for (const auto& x : messages)
    if (!x.is_object()) return;
  ax::jinja::Json images = row.contains("images") ? ax::jinja::Json::parse(row["images"].dump()) : ax::jinja::Json();
  ax::data::ChatImages out;
  if (!ax::data::read_chat_images(messages, images, "<image>", out).empty()) return;
  if (out.paths.size() != out.message.size()) std::abort();
  std::size_t parts = 0;
  for (std::size_t k = 0; k < out.paths.size(); ++k) {
    // Not a URL the parser refuses ("httpsX://a.png" is a relative path, as transformers' load_image takes it).
    const std::string& p = out.paths[k];
    if (p.empty() || p.rfind("http://", 0) == 0 || p.rfind("https://", 0) == 0 || p.rfind("data:", 0) == 0) std::abort();
    if (out.message[k] >= messages.size() || messages[out.message[k]].value("role", "") == "assistant") std::abort();
  }
  for (const auto& msg : messages)
    if (auto c = msg.find("content"); c != msg.end() && c->is_array())
      for (const auto& p : *c) {
        if (p.value("type", "") == "image_url") std::abort();
        parts += p.value("type", "") == "image";
      }
  if (parts != out.paths.size()) std::abort();
}

}  // namespace

AX_FUZZ_HARNESS(dataset_chat_images) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  static const std::string data_dir = MM_CPT_TEST_DATA;
  static const std::string model = data_dir + "/chat/model";
  static const std::unique_ptr<ax::Tokenizer> tok = [] {
    try {
      return ax::load_hf_tokenizer(model);
    } catch (const std::exception& e) {
      ax::fuzz::setup_failed("chat images tokenizer", e);
    }
  }();
  static const ax::Registry registry = [] {
    ax::Registry r;
    ax::data::register_builtin_datasets(r);
    ax::mm::add_mm_cpt_type(r);
    return r;
  }();
  static const auto type = registry.get<ax::DatasetType>(ax::ProviderKind::dataset, "chat_template");
  static const int32_t pad = tok->encode("<|image_pad|>", false).at(0), start = tok->encode("<|vision_start|>", false).at(0);
  if (size == 0) return;
  const std::uint8_t flags = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  {
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) check_parser(l);
  }
  const std::string path = ax::fuzz::scratch() + "/rows.jsonl";
  ax::fuzz::write_file(path, text);
  toml::table entry{{"type", "chat_template"}, {"path", path}, {"image_base_dir", data_dir + "/images"}, {"max_pixels", 3136}};
  ax::fuzz::add_chat_options(entry, flags);
  // The committed model is a qwen2_5_vl, whose description names the image processor "qwen2_vl" (the fuzz-only build
  // has no model families to ask: models/vlm.hpp).
  const ax::DatasetContext ctx{tok.get(), "fuzz.toml", ax::fuzz::scratch(), model, "qwen2_vl"};
  auto ds = type->open(entry, ctx);
  const int64_t vocab = tok->vocab_size();
  std::vector<ax::Sample> prepared;  // the rows get() makes, in order
  for (std::size_t i = 0; i < ds->size(); ++i) {
    ax::Sample s;
    try {
      s = ds->get(i);
    } catch (const ax::UsageError&) {
      continue;  // a text row the template refuses: named and refused
    }
    prepared.push_back(s);
    if (s.input_ids.size() != s.labels.size()) std::abort();
    int64_t pads = 0, starts = 0;
    for (std::size_t k = 0; k < s.input_ids.size(); ++k) {
      if (s.input_ids[k] < 0 || s.input_ids[k] >= vocab) std::abort();
      if (s.labels[k] != -100 && s.labels[k] != s.input_ids[k]) std::abort();
      if ((s.input_ids[k] == pad || s.input_ids[k] == start) && s.labels[k] != -100) std::abort();  // images never carry loss
      pads += s.input_ids[k] == pad;
      starts += s.input_ids[k] == start;
    }
    // What the model relies on: one grid row per image, one pad per merged patch, the patches' pixel rows.
    auto g = s.extras.find("image_grid_thw");
    if (g == s.extras.end()) {
      if (pads != 0) std::abort();
      continue;
    }
    const at::Tensor& grid = g->second;
    if (grid.size(0) != starts) std::abort();
    const int64_t patches = grid.size(0) ? grid.prod(1).sum().item<int64_t>() : 0;
    if (patches / 4 != pads || s.extras.at("pixel_values").size(0) != patches) std::abort();
  }
  // streaming = true: the rows it gives (a bad row named and passed over) are the prepared ones, in order. (A
  // JSON array file, which map-style data reads, is refused here by open_stream.)
  auto stream = dynamic_cast<const ax::StreamingDatasetType&>(*type).open_stream(entry, ctx);
  std::size_t k = 0;
  for (int rows = 0; rows < 10000; ++rows) {
    ax::Sample s;
    try {
      if (!stream->next(s)) break;
      if (s.materialise) s.materialise(s);
    } catch (const std::exception&) {  // what the stream's feed names as a bad row (data/stream_feed.cpp)
      continue;
    }
    if (k >= prepared.size() || s.input_ids != prepared[k].input_ids || s.labels != prepared[k].labels) std::abort();
    for (const auto& [name, t] : prepared[k].extras)
      if (!s.extras.count(name) || !at::equal(s.extras.at(name), t)) std::abort();
    ++k;
  }
  if (k != prepared.size()) std::abort();
}
