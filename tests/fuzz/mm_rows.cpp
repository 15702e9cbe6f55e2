// Data rows of the mm_cpt dataset type (plugins/mm_cpt/src/rows.cpp and mm_dataset.cpp): JSONL or a JSON array
// of raw rows (text with <image> placeholders, image paths) or tokenized rows, opened with the Qwen2-VL
// vision tokens and the plugin's committed test images. The first input byte picks the entry's options
// (bit 0: on_bad_row = "skip"; bit 1: rows = "tokenized"), the rest is the data file.
#include <cstdlib>
#include <memory>

#include <ATen/ATen.h>
#include <tbb/global_control.h>
#include <toml++/toml.h>

#include "axengine/hf_tokenizer.hpp"
#include "harness.hpp"
#include "mm_dataset.hpp"

AX_FUZZ_HARNESS(mm_rows) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  static const std::string data_dir = MM_CPT_TEST_DATA;
  static const std::unique_ptr<ax::Tokenizer> tok = [] {
    try {
      return ax::load_hf_tokenizer(data_dir + "/tokenizer");
    } catch (const std::exception& e) {
      ax::fuzz::setup_failed("mm_cpt tokenizer", e);
    }
  }();
  static const ax::mm::MmCptType type;
  static const int32_t image = tok->encode("<|image_pad|>", false).at(0);
  if (size == 0) return;
  const std::string path = ax::fuzz::scratch() + "/rows.jsonl";
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data + 1), size - 1});
  toml::table entry{{"type", "mm_cpt"}, {"path", path}, {"image_base_dir", data_dir + "/images"},
                    {"min_pixels", 784}, {"max_pixels", 3136}, {"max_decode_pixels", 1 << 20}};
  if (data[0] & 1) entry.insert("on_bad_row", "skip");
  if (data[0] & 2) entry.insert("rows", "tokenized");
  auto ds = type.open(entry, ax::DatasetContext{tok.get(), "fuzz.toml", ax::fuzz::scratch(), ""});
  for (std::size_t i = 0; i < ds->size(); ++i) {
    ax::Sample s = ds->get(i);
    // What the model relies on: equal lengths, one image token per merged patch, one grid row per image.
    if (s.input_ids.size() != s.labels.size()) std::abort();
    const at::Tensor& grid = s.extras.at("image_grid_thw");
    const at::Tensor& pv = s.extras.at("pixel_values");
    const int64_t patches = grid.numel() ? grid.prod(1).sum().item<int64_t>() : 0;
    if (pv.size(0) != patches || pv.size(1) != 1176) std::abort();
    int64_t tokens = 0;
    for (int32_t id : s.input_ids) tokens += id == image;
    if (tokens * 4 != patches) std::abort();
  }
}
