#include "mm_dataset.hpp"

#include <filesystem>
#include <mutex>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <tbb/parallel_for.h>

#include "axengine/config_binder.hpp"
#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"
#include "axengine/tokenizer.hpp"
#include "image.hpp"
#include "processor.hpp"
#include "rows.hpp"

namespace ax::mm {
namespace fs = std::filesystem;
namespace {

std::atomic<std::uint64_t> g_decodes{0};

struct Options {
  // The keys every [[datasets]] entry has (core's data/entry.cpp binds the same for the built-in types).
  std::string type, name, path, eval_path, on_bad_row = "error";
  double eval_fraction = -1;
  // Ours.
  std::string rows = "raw";
  std::string text_column = "text", image_column = "images", image_base_dir;
  std::string image_placeholder = "<image>";
  std::string vision_start_token = "<|vision_start|>", vision_end_token = "<|vision_end|>",
              image_token = "<|image_pad|>";
  bool add_bos = true, add_eos = true, streaming = false;
  int64_t min_pixels = 0, max_pixels = 0, max_decode_pixels = 0;
};

void bind(TableBinder& t, Options& o) {
  t.field("type", o.type, "dataset type");
  t.field("name", o.name, "name shown in logs (default: the file name)");
  t.field("path", o.path, "data file(s) of rows");
  t.field("eval_path", o.eval_path, "data file(s) of evaluation rows");
  t.field("eval_fraction", o.eval_fraction, "fraction held out for evaluation");
  t.choice("on_bad_row", o.on_bad_row, {"error", "skip"}, "a bad row or image stops naming file, row and image (error), or is dropped and counted (skip)");
  t.field("streaming", o.streaming, "read the rows lazily from JSON Lines shards (a glob), decoding each row's images when it is read; needs train.max_steps");
  t.choice("rows", o.rows, {"raw", "tokenized"}, "mm_cpt: raw = text with image placeholders, tokenised here; tokenized = rows of input_ids (and labels, attention_mask) whose image tokens are already expanded");
  t.field("text_column", o.text_column, "mm_cpt (raw rows): field holding the text, with one image_placeholder per image");
  t.field("image_column", o.image_column, "mm_cpt: field holding the row's image path or list of paths (absent or null: no image)");
  t.field("image_base_dir", o.image_base_dir, "mm_cpt: directory relative image paths resolve against, relative to the config (default: the data file's directory)");
  t.field("image_placeholder", o.image_placeholder, "mm_cpt (raw rows): the marker in the text that each image, in order, replaces");
  t.field("vision_start_token", o.vision_start_token, "mm_cpt: the tokenizer's token opening an image");
  t.field("vision_end_token", o.vision_end_token, "mm_cpt: the tokenizer's token closing an image");
  t.field("image_token", o.image_token, "mm_cpt: the tokenizer's image token, repeated once per merged patch");
  t.field("add_bos", o.add_bos, "mm_cpt (raw rows): start each sample with the tokenizer's BOS token (when it has one)");
  t.field("add_eos", o.add_eos, "mm_cpt (raw rows): end each sample with the tokenizer's EOS token");
  t.field("min_pixels", o.min_pixels, "mm_cpt: the processor's min_pixels (0: the model's preprocessor_config.json, else 3136)");
  t.field("max_pixels", o.max_pixels, "mm_cpt: the processor's max_pixels (0: the model's preprocessor_config.json, else 1003520)");
  t.field("max_decode_pixels", o.max_decode_pixels, "mm_cpt: images whose header declares more pixels are refused before decoding (0: 64 x max_pixels, at least 16777216)");
}

}  // namespace

void count_image_decode() { g_decodes.fetch_add(1, std::memory_order_relaxed); }

ProcessorConfig model_processor(const std::string& model_dir) {
  ProcessorConfig p;
  if (model_dir.empty()) return p;
  const fs::path file = fs::path(model_dir) / "preprocessor_config.json";
  std::error_code ec;
  if (!fs::exists(file, ec)) return p;
  nlohmann::json j = nlohmann::json::parse(read_regular_file(file.string()), nullptr, false);
  if (!j.is_object()) throw UsageError(ax::str(file.string(), ": not a JSON object"));
  auto num = [&](const nlohmann::json& o, const char* k, int64_t& out) {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) return;
    if (!it->is_number_integer()) throw UsageError(ax::str(file.string(), ": '", k, "' must be an integer"));
    out = it->get<int64_t>();
  };
  if (auto s = j.find("size"); s != j.end() && s->is_object()) {
    num(*s, "shortest_edge", p.min_pixels);
    num(*s, "longest_edge", p.max_pixels);
  }
  num(j, "min_pixels", p.min_pixels);
  num(j, "max_pixels", p.max_pixels);
  num(j, "patch_size", p.patch_size);
  num(j, "temporal_patch_size", p.temporal_patch_size);
  num(j, "merge_size", p.merge_size);
  for (auto [key, out] : {std::pair{"image_mean", &p.image_mean}, std::pair{"image_std", &p.image_std}})
    if (auto it = j.find(key); it != j.end() && it->is_array()) {
      out->clear();
      for (const auto& v : *it) {
        if (!v.is_number()) throw UsageError(ax::str(file.string(), ": '", key, "' must hold numbers"));
        out->push_back(v.get<double>());
      }
    }
  return p;
}

int32_t single_token(const Tokenizer& tok, const std::string& text, const char* key) {
  auto ids = tok.encode(text, false);
  if (ids.size() != 1)
    throw UsageError(ax::str("mm_cpt: the tokenizer has no single token '", text, "' (", key,
                             "); a Qwen2-VL / Qwen2.5-VL tokenizer has it"));
  return ids[0];
}

at::Tensor grid_tensor(const std::vector<ProcessedImage>& images) {
  at::Tensor grid = at::empty({static_cast<int64_t>(images.size()), 3}, at::kLong);  // as concat() makes it
  for (std::size_t i = 0; i < images.size(); ++i) {
    grid[static_cast<int64_t>(i)][0] = images[i].grid_t;
    grid[static_cast<int64_t>(i)][1] = images[i].grid_h;
    grid[static_cast<int64_t>(i)][2] = images[i].grid_w;
  }
  return grid;
}

at::Tensor decode_and_process(const std::vector<std::string>& files, const std::vector<ProcessedImage>& grids,
                              const ProcessorConfig& pc, const DecodeLimits& limits) {
  std::vector<ProcessedImage> done;
  for (std::size_t i = 0; i < files.size(); ++i) {
    g_decodes.fetch_add(1, std::memory_order_relaxed);
    Image img = decode_image_file(files[i], limits);
    try {
      done.push_back(process_image(img, pc));
    } catch (const UsageError& e) {
      throw UsageError(ax::str(files[i], ": ", e.what()));
    }
    // The header promised this grid, and the ids were made for it.
    if (done.back().grid_h != grids[i].grid_h || done.back().grid_w != grids[i].grid_w)
      throw UsageError(ax::str(files[i], ": decoded to ", img.width, "x", img.height, " pixels, unlike its header (grid ",
                               grids[i].grid_h, "x", grids[i].grid_w, ")"));
  }
  return concat(done, 3 * pc.temporal_patch_size * pc.patch_size * pc.patch_size).pixel_values;
}

namespace {

std::vector<std::string> image_paths(const nlohmann::json& row, const std::string& column) {
  auto it = row.find(column);
  if (it == row.end() || it->is_null()) return {};
  if (it->is_string()) return {it->get<std::string>()};
  if (!it->is_array()) throw UsageError(ax::str("field '", column, "' must be a path or a list of paths"));
  std::vector<std::string> out;
  for (const auto& v : *it) {
    if (!v.is_string()) throw UsageError(ax::str("field '", column, "' must be a path or a list of paths"));
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::vector<int32_t> int_list(const nlohmann::json& row, const std::string& key, bool required) {
  auto it = row.find(key);
  if (it == row.end() || it->is_null()) {
    if (required) throw UsageError(ax::str("field '", key, "' is missing"));
    return {};
  }
  if (!it->is_array()) throw UsageError(ax::str("field '", key, "' must be a list of integers"));
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      throw UsageError(ax::str("field '", key, "' must be a list of 32-bit integers"));
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return out;
}

struct Ids {
  int32_t start, end, image;
};

class MmDataset final : public Dataset {
 public:
  std::size_t size() const override { return samples_.size(); }
  Sample get(std::size_t i) const override { return samples_.at(i); }
  std::size_t skipped_rows() const override { return skipped_; }
  std::vector<Sample> samples_;
  std::size_t skipped_ = 0;
};

// One row -> one sample whose pixels are not decoded yet: the images' headers give their grids (so the token
// counts the text is expanded to, or the ids are checked against, and image_grid_thw); Sample::materialise
// decodes and processes the pixels into pixel_values. Map-style preparation (complete_sample) and a stream on
// one rank call it at once; with several data-parallel ranks only the rank that trains the sample does (core's
// StreamFeed and read_streamed_step), so each decodes only its own rows' images.
Sample make_sample(const nlohmann::json& row, const Options& o, const std::string& base, const ProcessorConfig& pc,
                   const DecodeLimits& limits, const Tokenizer& tok, const Ids& ids) {
  std::vector<std::string> paths = image_paths(row, o.image_column);
  std::string text;
  if (o.rows == "raw") {
    auto it = row.find(o.text_column);
    if (it == row.end()) throw UsageError(ax::str("field '", o.text_column, "' is missing"));
    if (!it->is_string()) throw UsageError(ax::str("field '", o.text_column, "' must be a string"));
    text = it->get<std::string>();
    std::size_t n = 0;
    for (std::size_t at = text.find(o.image_placeholder); at != std::string::npos;
         at = text.find(o.image_placeholder, at + o.image_placeholder.size()))
      ++n;
    if (n != paths.size())
      throw UsageError(ax::str("the text has ", n, " '", o.image_placeholder, "' placeholder(s) for ", paths.size(),
                               " image(s) in '", o.image_column, "'"));
  }
  std::vector<ProcessedImage> images;  // grids only
  std::vector<std::string> files;
  for (const auto& p : paths) {
    const std::string file = fs::path(p).is_absolute() ? p : (fs::path(base) / p).lexically_normal().string();
    const ImageHeader h = read_image_header_file(file, limits);
    try {
      images.push_back(image_grid(h.height, h.width, pc));
    } catch (const UsageError& e) {
      throw UsageError(ax::str(file, ": ", e.what()));
    }
    files.push_back(file);
  }
  int64_t expected_image_tokens = 0;
  for (const auto& im : images) expected_image_tokens += im.tokens(pc.merge_size);

  Sample s;
  if (o.rows == "raw") {
    // Each placeholder becomes the image's tokens; the whole text is then tokenised at once, as transformers'
    // processor does (the special tokens split the text, so pieces tokenise as they would alone).
    std::string full;
    std::size_t from = 0, k = 0;
    for (std::size_t at = text.find(o.image_placeholder); at != std::string::npos;
         at = text.find(o.image_placeholder, from), ++k) {
      full.append(text, from, at - from);
      full += o.vision_start_token;
      for (int64_t t = 0; t < images[k].tokens(pc.merge_size); ++t) full += o.image_token;
      full += o.vision_end_token;
      from = at + o.image_placeholder.size();
    }
    full.append(text, from, std::string::npos);
    if (o.add_bos && tok.bos_id() >= 0) s.input_ids.push_back(tok.bos_id());
    auto body = tok.encode(full, false);
    s.input_ids.insert(s.input_ids.end(), body.begin(), body.end());
    if (o.add_eos && tok.eos_id() >= 0) s.input_ids.push_back(tok.eos_id());
    s.labels = s.input_ids;
    for (auto& l : s.labels)  // the image's own tokens are inputs, not targets
      if (l == ids.image || l == ids.start || l == ids.end) l = -100;
  } else {
    auto in = int_list(row, "input_ids", true);
    auto labels = int_list(row, "labels", false);
    auto mask = int_list(row, "attention_mask", false);
    if (!labels.empty() && labels.size() != in.size())
      throw UsageError(ax::str("'labels' has ", labels.size(), " entries for ", in.size(), " input_ids"));
    if (!mask.empty() && mask.size() != in.size())
      throw UsageError(ax::str("'attention_mask' has ", mask.size(), " entries for ", in.size(), " input_ids"));
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!mask.empty() && mask[i] == 0) continue;  // padding: the engine packs itself
      s.input_ids.push_back(in[i]);
      s.labels.push_back(labels.empty() ? in[i] : labels[i]);
    }
  }
  int64_t found = 0;
  for (int32_t id : s.input_ids) found += id == ids.image;
  if (found != expected_image_tokens)
    throw UsageError(ax::str("the sample has ", found, " image tokens ('", o.image_token, "') where its ", images.size(),
                             " image(s) need ", expected_image_tokens,
                             o.rows == "raw" ? " (does the text contain the image token itself?)" : ""));
  const int64_t patch_dim = 3 * pc.temporal_patch_size * pc.patch_size * pc.patch_size;
  s.extras["image_grid_thw"] = grid_tensor(images);
  if (files.empty()) {
    s.extras["pixel_values"] = at::empty({0, patch_dim}, at::kFloat);
    return s;
  }
  s.materialise = [files = std::move(files), grids = std::move(images), pc, limits](Sample& out) {
    out.extras["pixel_values"] = decode_and_process(files, grids, pc, limits);
  };
  return s;
}

// make_sample with its pixels: what map-style preparation stores.
Sample complete_sample(const nlohmann::json& row, const Options& o, const std::string& base, const ProcessorConfig& pc,
                       const DecodeLimits& limits, const Tokenizer& tok, const Ids& ids) {
  Sample s = make_sample(row, o, base, pc, limits, tok, ids);
  if (s.materialise) {
    auto make = std::move(s.materialise);
    s.materialise = nullptr;
    make(s);
  }
  return s;
}

}  // namespace

std::uint64_t image_decodes() { return g_decodes.load(); }

void add_mm_cpt_type(Registry& registry) {
  Provider p;
  p.info.kind = ProviderKind::dataset;
  p.info.name = "mm_cpt";
  p.info.summary = "image + text rows (registered in-process)";
  p.object = std::make_shared<MmCptType>();
  registry.add(std::move(p));
}

std::vector<std::string> MmCptType::known_keys() const {
  return {"type", "name", "path", "eval_path", "eval_fraction", "on_bad_row", "rows", "text_column", "image_column",
          "image_base_dir", "image_placeholder", "vision_start_token", "vision_end_token", "image_token", "add_bos",
          "add_eos", "min_pixels", "max_pixels", "max_decode_pixels", "streaming"};
}

namespace {

// What open() and open_stream() read from the entry and the model: the options, the processor's settings, the
// decode limits, the vision token ids, the resolved data path and image dir.
struct Setup {
  Options o;
  ProcessorConfig pc;
  DecodeLimits limits;
  Ids ids{-1, -1, -1};
  std::string path, base_override;
};

Setup read_setup(const toml::table& entry, const DatasetContext& ctx) {
  if (!ctx.tokenizer) throw RuntimeError("mm_cpt dataset opened without a tokenizer");
  Setup st;
  Options& o = st.o;
  TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
  bind(t, o);
  t.finish();
  auto resolve = [&](const std::string& p) {
    return p.empty() || fs::path(p).is_absolute() || ctx.base_dir.empty() ? p
                                                                          : (fs::path(ctx.base_dir) / p).lexically_normal().string();
  };
  if (o.path.empty()) t.fail(nullptr, "this [[datasets]] entry has no 'path'");
  if (o.image_placeholder.empty()) t.fail(entry.get("image_placeholder"), "'image_placeholder' is empty");
  if (o.rows == "raw" && o.text_column.empty()) t.fail(entry.get("text_column"), "'text_column' is empty");
  if (o.rows == "tokenized")  // keys that only shape raw text would be silently unused
    for (const char* k : {"text_column", "image_placeholder", "add_bos", "add_eos"})
      if (entry.contains(k)) t.fail(entry.get(k), ax::str("'", k, "' applies to rows = \"raw\"; tokenized rows carry their ids"));
  if (o.min_pixels < 0 || o.max_pixels < 0 || o.max_decode_pixels < 0)
    t.fail(entry.get(o.min_pixels < 0 ? "min_pixels" : o.max_pixels < 0 ? "max_pixels" : "max_decode_pixels"),
           "pixel counts must be >= 0");

  ProcessorConfig& pc = st.pc;
  pc = model_processor(ctx.model_dir);
  if (o.min_pixels) pc.min_pixels = o.min_pixels;
  if (o.max_pixels) pc.max_pixels = o.max_pixels;
  try {
    pc.validate();
  } catch (const UsageError& e) {
    t.fail(entry.get(entry.contains("max_pixels") ? "max_pixels" : "min_pixels"), e.what());
  }
  DecodeLimits& limits = st.limits;
  limits.max_pixels = o.max_decode_pixels ? o.max_decode_pixels : std::max<int64_t>(64 * pc.max_pixels, 1 << 24);
  if (limits.max_pixels < pc.min_pixels) t.fail(entry.get("max_decode_pixels"), "'max_decode_pixels' is below min_pixels");

  const Tokenizer& tok = *ctx.tokenizer;
  st.ids = Ids{single_token(tok, o.vision_start_token, "vision_start_token"), single_token(tok, o.vision_end_token, "vision_end_token"),
               single_token(tok, o.image_token, "image_token")};
  st.path = resolve(o.path);
  st.base_override = resolve(o.image_base_dir);
  return st;
}

}  // namespace

std::unique_ptr<SampleStream> MmCptType::open_stream(const toml::table& entry, const DatasetContext& ctx) const {
  auto st = std::make_shared<const Setup>(read_setup(entry, ctx));
  image_token_id_.store(st->ids.image);
  const Tokenizer* tok = ctx.tokenizer;
  // Core's JSON Lines shard stream (axengine/stream.hpp); a row's images are decoded here, when it is read.
  return make_jsonl_stream(stream_shards(st->path), st->o.on_bad_row == "skip",
                           [st, tok](const nlohmann::json& row, const std::string& shard) {
                             const std::string base = !st->base_override.empty() ? st->base_override : fs::path(shard).parent_path().string();
                             return make_sample(row, st->o, base, st->pc, st->limits, *tok, st->ids);
                           });
}

std::shared_ptr<Dataset> MmCptType::open(const toml::table& entry, const DatasetContext& ctx) const {
  const Setup st = read_setup(entry, ctx);
  const Options& o = st.o;
  const ProcessorConfig& pc = st.pc;
  const DecodeLimits& limits = st.limits;
  const Ids& ids = st.ids;
  const Tokenizer& tok = *ctx.tokenizer;
  image_token_id_.store(ids.image);
  Rows rows = read_rows(st.path);
  const std::string& base_override = st.base_override;
  auto ds = std::make_shared<MmDataset>();
  std::vector<Sample> samples(rows.rows.size());
  std::vector<std::string> errors(rows.rows.size());
  tbb::parallel_for(std::size_t(0), rows.rows.size(), [&](std::size_t i) {
    const Row& r = rows.rows[i];
    const std::string base = !base_override.empty() ? base_override : fs::path(rows.files[r.file].path).parent_path().string();
    try {
      samples[i] = complete_sample(r.value, o, base, pc, limits, tok, ids);
    } catch (const std::exception& e) {
      errors[i] = ax::str(rows.where(r), ": ", e.what());
    }
  });
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (errors[i].empty()) {
      ds->samples_.push_back(std::move(samples[i]));
    } else if (o.on_bad_row == "skip") {
      ++ds->skipped_;
    } else {
      throw UsageError(errors[i]);
    }
  }
  return ds;
}

std::map<std::string, at::Tensor> MmCptType::collate(const BatchLayout& layout) const {
  // Per-sample media, concatenated in the batch's sample order (rows, then offsets: the order of the image
  // tokens in the packed batch), which is the order the model splices them back in.
  std::vector<at::Tensor> pv, grid;
  const int32_t image = image_token_id_.load();
  for (const auto& p : layout.samples) {
    const Sample& s = *p.sample;
    auto pit = s.extras.find("pixel_values");
    auto git = s.extras.find("image_grid_thw");
    if (pit == s.extras.end() || git == s.extras.end()) continue;  // a text-only sample of another type
    if (p.length < static_cast<int64_t>(s.input_ids.size()))
      for (std::size_t k = static_cast<std::size_t>(p.length); k < s.input_ids.size(); ++k)
        if (s.input_ids[k] == image)
          throw UsageError(ax::str("mm_cpt: a sample of ", s.input_ids.size(), " tokens is cut to ", p.length,
                                   " inside its image tokens; raise data.sequence_len or lower max_pixels"));
    pv.push_back(pit->second);
    grid.push_back(git->second);
  }
  std::map<std::string, at::Tensor> out;
  out["pixel_values"] = pv.empty() ? at::empty({0, 1176}, at::kFloat) : at::cat(pv, 0);
  out["image_grid_thw"] = grid.empty() ? at::empty({0, 3}, at::kLong) : at::cat(grid, 0);
  return out;
}

}  // namespace ax::mm
