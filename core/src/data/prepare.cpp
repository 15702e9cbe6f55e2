#include "data/prepare.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <memory>
#include <filesystem>
#include <limits>
#include <mutex>
#include <sstream>

#include <ATen/ATen.h>
#include <tbb/parallel_for.h>
// Header-only (XXH_INLINE_ALL): nothing to link, the Debian package libxxhash-dev is needed at build time only.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "data/dataset_source.hpp"
#include "data/entry.hpp"
#include "data/jsonl.hpp"
#include "data/packing.hpp"
#include "data/types.hpp"

namespace fs = std::filesystem;

namespace ax::data {
namespace {

// v3: per sample, where it came from ("lines": its row in its file, "files": which file, the files and their
// formats in the metadata; for errors found after tokenising) and the samples' named extras ("extra.<name>",
// see cache_extras).
constexpr const char* kCacheFormat = "axengine-prepared-v3";

// One dataset entry's samples and, when the type says (RowLines), the file and row each came from.
struct FileSamples {
  std::string file;  // the entry's path (a glob, maybe)
  std::vector<Sample> samples;
  RowSources sources;  // origins empty: the type did not say

  // "data.jsonl:7", "data.json: element 6", or "data.jsonl: sample 6" when the row is unknown.
  std::string where(std::size_t i) const {
    return i < sources.origins.size() ? sources.where(i) : ax::str(file, ": sample ", i);
  }
};

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 15];
  return s;
}

// Two FNV-1a lanes: 128 bits, plenty to key a cache.
std::string hash128(const std::string& text) {
  uint64_t a = 0xcbf29ce484222325ULL, b = 0x84222325cbf29ce4ULL;
  for (unsigned char c : text) {
    a = (a ^ c) * 0x100000001b3ULL;
    b = (b ^ (c + 0x5bu)) * 0x100000001b3ULL;
  }
  return hex64(a) + hex64(mix_seed(b, a));
}

// XXH3-128 of a file's bytes (hex), "" when it cannot be read (the dataset type's open() then says why). The
// key must be known before the cache can be looked up, so this is a read of its own ahead of tokenising (XXH3
// hashes faster than a disk reads; the tokeniser's read then finds the file in the page cache): a file edited in place keeping its
// size and mtime (a tool that restores the mtime, an mtime-preserving copy) would otherwise be served stale.
std::string content_hash(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_128bits_reset(state.get());
  std::vector<char> buf(std::size_t(1) << 20);
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return "";
    }
    XXH3_128bits_update(state.get(), buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  const XXH128_hash_t h = XXH3_128bits_digest(state.get());
  return hex64(h.high64) + hex64(h.low64);
}

// Every string value of the entry that names an existing file contributes its size and a hash of its bytes,
// so editing a data file invalidates its cache without the engine knowing which keys a (plugin) type reads.
void describe_files(const toml::table& entry, const std::string& base_dir, std::ostringstream& os) {
  for (const auto& [k, v] : entry) {
    const auto* s = v.as_string();
    if (!s) continue;
    std::string value = resolve_against(base_dir, s->get());
    // A glob names every file it matches: adding, removing or editing one invalidates the cache too.
    std::vector<std::string> paths{value};
    if (is_glob(value)) try {
        paths = expand_data_path(value);
      } catch (const UsageError&) {
        paths.clear();  // matches nothing: the type's open() says so
      }
    if (paths.size() == 1 && is_directory(value)) paths = dataset_dir_files(value);  // datasets' save_to_disk / cache dir
    for (const auto& p : paths) {
      struct stat st {};
      if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      os << "file " << k.str() << " " << fs::absolute(p).lexically_normal().string() << " " << st.st_size << " xxh3 "
         << content_hash(p) << "\n";
    }
  }
}

// Extras in the cache: per name, every sample's tensor concatenated along dim 0 ("extra.<name>"), the
// samples' row spans ("extra_offsets.<name>", int64 [n+1]) and which samples have it ("extra_present.<name>").
constexpr const char* kExtra = "extra.";

void cache_extras(const std::vector<Sample>& samples, std::vector<std::pair<std::string, at::Tensor>>& out) {
  std::map<std::string, std::vector<at::Tensor>> parts;
  for (const auto& s : samples)
    for (const auto& [name, t] : s.extras) parts[name];
  for (auto& [name, list] : parts) {
    std::vector<int64_t> offsets{0};
    std::vector<uint8_t> present;
    at::Tensor like;
    for (const auto& s : samples) {
      auto it = s.extras.find(name);
      present.push_back(it != s.extras.end());
      if (it != s.extras.end()) list.push_back(it->second.contiguous()), like = it->second;
      offsets.push_back(offsets.back() + (it != s.extras.end() ? it->second.size(0) : 0));
    }
    out.emplace_back(kExtra + name, at::cat(list, 0));
    out.emplace_back("extra_offsets." + name, at::tensor(offsets, at::kLong));
    out.emplace_back("extra_present." + name, at::tensor(std::vector<int64_t>(present.begin(), present.end()), at::kLong).to(at::kByte));
  }
}

bool load_cached_extras(const safetensors::File& f, std::vector<Sample>& samples) {
  const int64_t n = static_cast<int64_t>(samples.size());
  for (const auto& info : f.tensors()) {
    if (info.name.rfind(kExtra, 0) != 0) continue;
    const std::string name = info.name.substr(std::string(kExtra).size());
    if (!f.find("extra_offsets." + name) || !f.find("extra_present." + name)) return false;
    at::Tensor all = f.get(info.name), off = f.get("extra_offsets." + name), has = f.get("extra_present." + name);
    if (off.scalar_type() != at::kLong || off.dim() != 1 || off.size(0) != n + 1 || has.scalar_type() != at::kByte ||
        has.dim() != 1 || has.size(0) != n || all.dim() < 1)
      return false;
    const int64_t* po = off.data_ptr<int64_t>();
    const uint8_t* ph = has.data_ptr<uint8_t>();
    if (po[0] != 0 || po[n] != all.size(0)) return false;
    for (int64_t i = 0; i < n; ++i) {
      if (po[i + 1] < po[i]) return false;
      if (ph[i]) samples[i].extras[name] = all.narrow(0, po[i], po[i + 1] - po[i]).clone();
    }
  }
  return true;
}

bool load_cache(const std::string& path, FileSamples& out, std::size_t& skipped) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    auto f = safetensors::File::open(path);
    auto meta = f->metadata();
    if (meta["format"] != kCacheFormat) return false;
    auto ids = f->get("input_ids"), labels = f->get("labels"), offsets = f->get("offsets"), lines = f->get("lines"),
         files = f->get("files");
    if (ids.scalar_type() != at::kInt || labels.scalar_type() != at::kInt || offsets.scalar_type() != at::kLong ||
        lines.scalar_type() != at::kLong || files.scalar_type() != at::kLong || ids.dim() != 1 ||
        labels.sizes() != ids.sizes() || offsets.dim() != 1 || offsets.size(0) < 1 || lines.dim() != 1 ||
        lines.size(0) != offsets.size(0) - 1 || files.sizes() != lines.sizes())
      return false;
    out.sources = RowSources{};
    auto names = nlohmann::json::parse(meta["files"], nullptr, false);
    if (!names.is_array()) return false;
    for (const auto& n : names) {
      if (!n.is_array() || n.size() != 2 || !n[0].is_string() || !n[1].is_number_integer()) return false;
      const int fmt = n[1].get<int>();
      if (fmt < 0 || fmt > static_cast<int>(kLastFileFormat)) return false;
      out.sources.files.push_back({n[0].get<std::string>(), static_cast<FileFormat>(fmt)});
    }
    const int64_t* pf = files.data_ptr<int64_t>();
    const int32_t* pi = ids.data_ptr<int32_t>();
    const int32_t* pl = labels.data_ptr<int32_t>();
    const int64_t* po = offsets.data_ptr<int64_t>();
    const int64_t* pn = lines.data_ptr<int64_t>();
    int64_t n = offsets.size(0) - 1;
    if (po[0] != 0 || po[n] != ids.size(0)) return false;
    out.samples.clear();
    out.samples.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      if (po[i + 1] <= po[i] || pn[i] < 0) return false;
      out.samples.push_back(Sample{{pi + po[i], pi + po[i + 1]}, {pl + po[i], pl + po[i + 1]}, {}});
      // A file index of -1: the type gave no origins (a plugin type), every sample has -1.
      if (pf[i] >= 0) {
        if (static_cast<std::size_t>(pf[i]) >= out.sources.files.size()) return false;
        out.sources.origins.push_back({static_cast<std::uint32_t>(pf[i]), static_cast<std::uint64_t>(pn[i])});
      }
    }
    if (!out.sources.origins.empty() && out.sources.origins.size() != out.samples.size()) return false;
    if (!load_cached_extras(*f, out.samples)) return false;
    skipped = std::stoull(meta["skipped"]);
    return true;
  } catch (const std::exception& e) {
    log::warn(ax::str("prepared-data cache ", path, " is unusable (", e.what(), "); rebuilding it"));
    return false;
  }
}

void save_cache(const std::string& path, const FileSamples& data, std::size_t skipped, const std::string& key) {
  std::vector<int32_t> ids, labels;
  std::vector<int64_t> offsets{0}, lines, files;
  for (const auto& s : data.samples) {
    ids.insert(ids.end(), s.input_ids.begin(), s.input_ids.end());
    labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
  const bool known = data.sources.origins.size() == data.samples.size();
  for (std::size_t i = 0; i < data.samples.size(); ++i) {
    lines.push_back(known ? static_cast<int64_t>(data.sources.origins[i].index) : 0);
    files.push_back(known ? static_cast<int64_t>(data.sources.origins[i].file) : -1);
  }
  nlohmann::json names = nlohmann::json::array();
  for (const auto& f : data.sources.files) names.push_back({f.path, static_cast<int>(f.format)});
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  try {
    std::vector<std::pair<std::string, at::Tensor>> tensors{
        {"input_ids", at::tensor(ids, at::kInt)}, {"labels", at::tensor(labels, at::kInt)}, {"offsets", at::tensor(offsets, at::kLong)},
        {"lines", at::tensor(lines, at::kLong)}, {"files", at::tensor(files, at::kLong)}};
    cache_extras(data.samples, tensors);
    safetensors::save(path, tensors, {{"format", kCacheFormat}, {"skipped", std::to_string(skipped)}, {"key", key},
                                      {"files", names.dump()}}, "data_cache");
  } catch (const std::exception& e) {
    log::warn(ax::str("cannot write the prepared-data cache ", path, ": ", e.what()));  // the run goes on without it
  }
}

// One extra name has one dtype and one shape but for dim 0 in every sample of a dataset, on the CPU: what
// the cache and collation rely on.
void check_extras(const std::vector<Sample>& samples, const std::string& name) {
  std::map<std::string, std::pair<std::size_t, const at::Tensor*>> first;
  for (std::size_t i = 0; i < samples.size(); ++i)
    for (const auto& [key, t] : samples[i].extras) {
      auto where = ax::str("dataset ", name, ": sample ", i, " extra '", key, "' ");
      if (!t.defined() || t.dim() < 1) throw UsageError(where + "must be a tensor of at least one dimension");
      if (!t.is_cpu()) throw UsageError(where + ax::str("is on ", t.device(), "; dataset types give CPU tensors"));
      auto [it, fresh] = first.try_emplace(key, i, &t);
      if (fresh) continue;
      const at::Tensor& f = *it->second.second;
      if (f.scalar_type() != t.scalar_type() || f.sizes().slice(1) != t.sizes().slice(1))
        throw UsageError(where + ax::str("is ", t.scalar_type(), " ", t.sizes(), " but in sample ", it->second.first, " ",
                                         f.scalar_type(), " ", f.sizes(), " (only dim 0 may vary)"));
    }
}

// Opens one dataset file (the entry as given) and tokenises every row in parallel. An error while tokenising a
// row (a tokenizer regex over its limits, a normalizer blowing the text up) names the file and line of the
// first such row; the structural guarantees are checked here so plugin types get the same ones as ours.
FileSamples tokenise(const DatasetType& type, const toml::table& entry, const DatasetContext& ctx, std::size_t& skipped) {
  auto ds = type.open(entry, ctx);
  FileSamples out;
  out.file = resolve_against(ctx.base_dir, entry["path"].value_or(std::string()));
  out.samples.resize(ds->size());
  std::mutex failed_mutex;
  std::size_t failed = std::numeric_limits<std::size_t>::max();
  std::string failure;
  tbb::parallel_for(std::size_t(0), out.samples.size(), [&](std::size_t i) {
    try {
      out.samples[i] = ds->get(i);
    } catch (const std::exception& e) {  // keep the first row in file order, whichever thread saw it first
      std::lock_guard<std::mutex> lock(failed_mutex);
      if (i < failed) {
        failed = i;
        failure = e.what();
      }
    }
  });
  if (const auto* rows = dynamic_cast<const RowLines*>(ds.get())) {
    out.sources = rows->row_sources();
    if (out.sources.origins.size() != out.samples.size())
      throw RuntimeError(ax::str(out.file, ": the dataset type gave ", out.sources.origins.size(), " row origins for ",
                                 out.samples.size(), " samples"));
  }
  if (failed != std::numeric_limits<std::size_t>::max()) throw UsageError(ax::str(out.where(failed), ": ", failure));
  skipped = ds->skipped_rows();
  for (std::size_t i = 0; i < out.samples.size(); ++i) {
    const auto& s = out.samples[i];
    if (s.input_ids.empty()) throw UsageError(ax::str(out.where(i), ": the sample has no tokens"));
    if (s.labels.size() != s.input_ids.size())
      throw UsageError(ax::str(out.where(i), ": the sample has ", s.labels.size(), " labels for ", s.input_ids.size(), " tokens"));
    // Deferred extras are a stream's (Sample::materialise): a prepared sample is complete, cached as it is.
    if (s.materialise)
      throw RuntimeError(ax::str(out.where(i), ": the dataset type's get() returned a sample with materialise set; only a stream's samples may defer their extras"));
  }
  check_extras(out.samples, out.file);
  return out;
}

// Every id and label within the tokenizer's vocabulary and the model's (config.json vocab_size, when known):
// an id the embedding does not have would otherwise surface only in the forward pass, naming no row.
void check_ids(const FileSamples& data, const Tokenizer& tokenizer, int64_t model_vocab) {
  const int64_t tok_vocab = tokenizer.vocab_size();
  const int64_t limit = model_vocab > 0 ? std::min(tok_vocab, model_vocab) : tok_vocab;
  for (std::size_t i = 0; i < data.samples.size(); ++i) {
    const auto& s = data.samples[i];
    for (std::size_t k = 0; k < s.input_ids.size(); ++k) {
      const int64_t id = s.input_ids[k], label = s.labels[k];
      const bool bad_id = id < 0 || id >= limit, bad_label = label != -100 && (label < 0 || label >= limit);
      if (!bad_id && !bad_label) continue;
      const int64_t v = bad_id ? id : label;
      std::string what = ax::str(bad_id ? "token " : "label ", k, " = ", v);
      if (v >= 0 && v < tok_vocab)
        throw UsageError(ax::str(data.where(i), ": ", what, " is beyond the model's vocabulary (config.json vocab_size ", model_vocab,
                                 "; the tokenizer has ", tok_vocab, "): the tokenizer and the model do not match"));
      throw UsageError(ax::str(data.where(i), ": ", what, " is outside the tokenizer's vocabulary (", tok_vocab, ")"));
    }
  }
}

// True when the sample has a position the loss counts once packed into rows of `sequence_len`: a label other
// than -100 at 1 <= k < min(length, sequence_len) (the first token of a packed sample is never predicted, and
// a longer sample is cut).
bool has_loss_token(const Sample& s, int64_t sequence_len) {
  const std::size_t n = std::min(s.labels.size(), static_cast<std::size_t>(std::max<int64_t>(sequence_len, 0)));
  for (std::size_t k = 1; k < n; ++k)
    if (s.labels[k] != -100) return true;
  return false;
}

// Drops the samples `why` finds a reason against (on_bad_row: "error" names the first such row, "skip" drops
// them all); returns how many were dropped.
std::size_t drop_samples(FileSamples& data, BadRowPolicy policy, bool warn, const std::function<std::string(const Sample&)>& why) {
  std::vector<Sample> kept;
  std::vector<RowOrigin> kept_origins;
  const bool known = data.sources.origins.size() == data.samples.size();
  for (std::size_t i = 0; i < data.samples.size(); ++i) {
    std::string reason = why(data.samples[i]);
    if (reason.empty()) {
      kept.push_back(std::move(data.samples[i]));
      if (known) kept_origins.push_back(data.sources.origins[i]);
      continue;
    }
    if (policy == BadRowPolicy::error) throw UsageError(ax::str(data.where(i), ": ", reason));
    if (warn) log::warn(ax::str(data.where(i), ": ", reason, " (on_bad_row = \"skip\": dropped)"));
  }
  const std::size_t dropped = data.samples.size() - kept.size();
  data.samples = std::move(kept);
  data.sources.origins = std::move(kept_origins);
  return dropped;
}

// Samples with nothing to learn would make a micro-batch of them a mean over no tokens.
std::size_t drop_samples_without_loss(FileSamples& data, int64_t sequence_len, BadRowPolicy policy) {
  return drop_samples(data, policy, /*warn=*/false, [&](const Sample& s) -> std::string {
    if (has_loss_token(s, sequence_len)) return "";
    return ax::str("no token to train on within data.sequence_len = ", sequence_len,
                   " (every label is -100, or the prompt fills the first ", sequence_len,
                   " tokens); raise sequence_len, fix the row, or set on_bad_row = \"skip\" to drop such rows");
  });
}

FileSamples load_file(const DatasetType& type, const std::string& type_name, const toml::table& entry,
                      const DatasetContext& ctx, const DataConfig& data, const std::string& name,
                      SourceReport& report, std::size_t& skipped) {
  std::string key = dataset_cache_key(type_name, entry, ctx.base_dir, *ctx.tokenizer);
  // Files of the model dir a type may read (the chat_template type renders with the model's template; the
  // mm_cpt plugin's image processor takes its settings from preprocessor_config.json, gemma3's image token count
  // from config.json).
  if (!ctx.model_dir.empty()) {
    toml::table model_files{{"chat_template.jinja", "chat_template.jinja"}, {"chat_template.json", "chat_template.json"},
                            {"tokenizer_config.json", "tokenizer_config.json"}, {"preprocessor_config.json", "preprocessor_config.json"},
                            {"config.json", "config.json"}};
    std::ostringstream os;
    describe_files(model_files, ctx.model_dir, os);
    key += os.str();
  }
  // The processor the model's family names makes the image rows' tokens and pixels (absent for a text-only model,
  // so those keys are as before).
  if (!ctx.image_processor.empty()) key += "image_processor " + ctx.image_processor + "\n";
  std::string file = (fs::path(data.cache_dir) / (hash128(key) + ".safetensors")).string();
  FileSamples samples;
  if (data.cache && load_cache(file, samples, skipped)) {
    samples.file = resolve_against(ctx.base_dir, entry["path"].value_or(std::string()));
    report.from_cache = true;
    report.cache_file = file;
    return samples;
  }
  samples = tokenise(type, entry, ctx, skipped);
  if (samples.samples.empty()) throw UsageError(ax::str("dataset ", name, ": no usable rows"));
  if (data.cache) {
    save_cache(file, samples, skipped, key);
    report.cache_file = file;
  }
  return samples;
}

}  // namespace

std::string dataset_cache_key(const std::string& type, const toml::table& entry, const std::string& base_dir,
                              const Tokenizer& tokenizer) {
  std::ostringstream os;
  os << kCacheFormat << "\ntype " << type << "\nbase " << base_dir << "\n" << toml::toml_formatter{entry} << "\n";
  describe_files(entry, base_dir, os);
  os << "tokenizer " << tokenizer.fingerprint() << "\n";
  return os.str();
}

PreparedData prepare_datasets(const RunConfig& config, const DataConfig& data, const Registry& registry,
                              const Tokenizer& tokenizer, int64_t model_vocab, const std::string& image_processor) {
  auto entries = dataset_entries(config);
  if (entries.empty()) throw UsageError(ax::str(config.file, ": no [[datasets]] entry: nothing to train on"));
  PreparedData out;
  DatasetContext ctx{&tokenizer, config.file, config.dir, config.model.path, image_processor};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const toml::table& entry = *entries[i];
    TableBinder t(&entry, "datasets", BindContext{config.file, nullptr});
    CommonEntry common;
    bind_common_entry(t, common);
    auto type = registry.get<DatasetType>(ProviderKind::dataset, common.type);
    if (!type) {
      std::vector<std::string> names;
      for (const auto* p : registry.list(ProviderKind::dataset)) names.push_back(p->info.name);
      std::string hint = closest(common.type, names);
      config_fail(config.file, entry.get("type"),
                  ax::str("unknown dataset type \"", common.type, "\" (known: ", join(names, ", "), ")",
                      hint.empty() ? "" : ax::str("; did you mean \"", hint, "\"?")));
    }
    std::string name = common.name.empty() ? fs::path(common.path).filename().string() : common.name;
    SourceReport report;
    report.name = name;

    // What the type sees: the entry without the split keys (they are the engine's business and must not
    // change the cache key of the training file).
    toml::table train_entry = entry;
    train_entry.erase("eval_path");
    train_entry.erase("eval_fraction");
    train_entry.erase("eval_split");
    const BadRowPolicy policy = parse_bad_row_policy(common.on_bad_row);
    // After the cache: the model and sequence_len are not part of its key.
    auto usable = [&](FileSamples f) {
      check_ids(f, tokenizer, model_vocab);
      // A type whose samples must not be cut (chat_template's images) says which do not fit sequence_len.
      if (const auto* fit = dynamic_cast<const SampleFit*>(type.get()))
        report.unfit += drop_samples(f, policy, /*warn=*/true, [&](const Sample& s) { return fit->unfit(s, data.sequence_len); });
      report.no_loss += drop_samples_without_loss(f, data.sequence_len, policy);
      if (f.samples.empty())
        throw UsageError(ax::str(f.file, ": no row has a token to train on within data.sequence_len = ", data.sequence_len));
      return std::move(f.samples);
    };
    std::size_t skipped = 0;
    std::vector<Sample> train;
    if (common.streaming) {  // read lazily by the trainer; only eval_path is prepared here
      out.stream = open_stream_entry(config, entry, train_entry, common, *type, ctx, data, tokenizer, model_vocab, entries.size());
      out.collator = type, out.collator_type = common.type;  // its samples' extras are known only as they come
      report.shards = out.stream->stream().shards().size();
    } else {
      train = usable(load_file(*type, common.type, train_entry, ctx, data, name, report, skipped));
    }
    report.skipped = skipped;
    std::vector<Sample> eval;
    if (!common.eval_path.empty() || !common.eval_split.empty()) {
      toml::table eval_entry = train_entry;  // eval_path's rows (all, or eval_split of them), else eval_split of path
      if (!common.eval_path.empty()) eval_entry.insert_or_assign("path", common.eval_path), eval_entry.erase("split");
      if (!common.eval_split.empty()) eval_entry.insert_or_assign("split", common.eval_split);
      SourceReport eval_report;
      eval = usable(load_file(*type, common.type, eval_entry, ctx, data, name + " (eval)", eval_report, skipped));
      report.skipped += skipped;
    } else {
      double fraction = common.eval_fraction >= 0 ? common.eval_fraction : data.eval_fraction;
      if (fraction >= 1) config_fail(config.file, entry.get("eval_fraction"), "'eval_fraction' must be in [0, 1)");
      std::size_t n_eval = static_cast<std::size_t>(fraction * static_cast<double>(train.size()) + 0.5);
      if (n_eval >= train.size() && n_eval > 0)
        throw UsageError(ax::str("dataset ", name, ": eval_fraction ", fraction, " leaves no training rows of ", train.size()));
      if (n_eval > 0) {
        // Seeded, so the split is the same on every run and resume with this seed.
        auto perm = permutation(train.size(), mix_seed(static_cast<uint64_t>(config.run.seed), 0xe7a1 + i));
        std::vector<char> is_eval(train.size(), 0);
        for (std::size_t k = 0; k < n_eval; ++k) is_eval[perm[k]] = 1;
        std::vector<Sample> kept;
        for (std::size_t k = 0; k < train.size(); ++k) (is_eval[k] ? eval : kept).push_back(std::move(train[k]));
        train = std::move(kept);
      }
    }
    bool extras = false;
    for (const auto* part : {&train, &eval})
      for (const auto& smp : *part) extras |= !smp.extras.empty();
    if (extras && out.collator && out.collator_type != common.type)
      throw UsageError(ax::str(config.file, ": datasets of type \"", out.collator_type, "\" and \"", common.type,
                               "\" both carry extras; one run mixes at most one type with extras (its collate() builds every batch)"));
    if (extras) out.collator = type, out.collator_type = common.type;
    report.train = train.size();
    report.eval = eval.size();
    for (auto& s : train) out.train.push_back(std::move(s));
    for (auto& s : eval) out.eval.push_back(std::move(s));
    out.sources.push_back(report);
  }
  // It paces the reading of a stream; map-style rows are all prepared before step 1: set, it would do nothing.
  if (!out.stream)
    if (const toml::node* n = config.document.at_path("data.prefetch_steps").node())
      config_fail(config.file, n, "data.prefetch_steps applies to a streamed dataset (streaming = true); this run's data is "
                                  "map-style, prepared before the first step");
  return out;
}

std::string describe(const PreparedData& data) {
  std::vector<std::string> lines;
  for (const auto& s : data.sources)
    lines.push_back(ax::str("dataset ", s.name, ": ",
                        s.shards ? ax::str("streamed from ", s.shards, " shard(s), read as training goes; ", s.eval, " eval samples")
                                 : ax::str(s.train, " train / ", s.eval, " eval samples"),
                        s.skipped ? ax::str(", ", s.skipped, " bad rows skipped") : std::string(),
                        s.no_loss ? ax::str(", ", s.no_loss, " rows without a token to train on within sequence_len dropped") : std::string(),
                        s.unfit ? ax::str(", ", s.unfit, " rows whose images do not fit sequence_len dropped") : std::string(),
                        s.shards && !s.eval ? "" : s.from_cache ? " (prepared cache)" : " (tokenised)"));
  return join(lines, "\n");
}

}  // namespace ax::data
