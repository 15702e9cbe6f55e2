#include "data/dataset_source.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"

namespace fs = std::filesystem;

namespace ax::data {
namespace {

// state.json's keys, as save_to_disk writes them (datasets 2.x-5.x; _indexes and _indices_data_files: 1.x).
const std::set<std::string> kStateKeys{"_data_files", "_fingerprint", "_format_columns", "_format_kwargs", "_format_type",
                                       "_output_all_columns", "_split", "_indexes", "_indices_data_files"};
// The feature types of datasets 5.2 (features/features.py _FEATURE_TYPES, and the older Sequence).
const std::set<std::string> kFeatureTypes{"Value", "ClassLabel", "Translation", "TranslationVariableLanguages", "LargeList",
                                          "List", "Sequence", "Array2D", "Array3D", "Array4D", "Array5D", "Audio",
                                          "Image", "Mesh", "Video", "Pdf", "Nifti", "BioSequence", "BioStructure", "Json"};
constexpr const char* kNewer = "written by a newer version of HF datasets than axengine reads (it reads the layouts of datasets 2.x to 5.x)";

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

nlohmann::json read_json(const fs::path& p, const char* what) {
  const std::string text = read_regular_file(p.string(), what);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw UsageError(ax::str(p.string(), ": not a JSON object (", what, ")"));
  return j;
}

// A file name a layout file lists: a plain name inside the directory, never a path out of it.
std::string plain_name(const nlohmann::json& v, const fs::path& listed_in, const std::string& key) {
  if (!v.is_string()) throw UsageError(ax::str(listed_in.string(), ": ", key, " must be a string"));
  const std::string s = v.get<std::string>();
  if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\0') != std::string::npos)
    throw UsageError(ax::str(listed_in.string(), ": ", key, " \"", s, "\" is not a file name in this directory"));
  return s;
}

// Every feature type dataset_info.json declares must be one datasets 5.2 knows: a newer type (a new storage
// for values) would be read as its raw Arrow storage, not as datasets decodes it.
void check_features(const nlohmann::json& f, const fs::path& info, int depth = 0) {
  if (depth > 64) throw UsageError(ax::str(info.string(), ": features are nested too deeply"));
  if (f.is_array()) {
    for (const auto& e : f) check_features(e, info, depth + 1);
  } else if (f.is_object()) {
    if (auto t = f.find("_type"); t != f.end()) {
      if (!t->is_string()) throw UsageError(ax::str(info.string(), ": a feature's _type is not a string"));
      if (!kFeatureTypes.count(t->get<std::string>()))
        throw UsageError(ax::str(info.string(), ": feature type '", t->get<std::string>(), "' is unknown: ", kNewer));
      for (const char* inner : {"feature"})
        if (auto in = f.find(inner); in != f.end()) check_features(*in, info, depth + 1);
      return;
    }
    for (const auto& [k, v] : f.items()) check_features(v, info, depth + 1);
  }
}

DataFile arrow_file(const fs::path& dir, const std::string& name, const fs::path& listed_in) {
  const fs::path p = dir / name;
  if (!path_exists(p))
    throw UsageError(ax::str(listed_in.string(), " lists ", name, ", which is missing: the dataset is incomplete (a save or a "
                             "load_dataset that did not finish?); save or load it again"));
  return {p.string(), FileFormat::arrow};
}

// A Dataset save_to_disk wrote.
SplitSource saved_dataset(const fs::path& dir) {
  const fs::path state_path = dir / "state.json", info_path = dir / "dataset_info.json";
  const nlohmann::json state = read_json(state_path, "datasets' state.json");
  for (const auto& [k, v] : state.items())
    if (!kStateKeys.count(k)) throw UsageError(ax::str(state_path.string(), ": key '", k, "' is unknown: ", kNewer));
  if (auto idx = state.find("_indices_data_files"); idx != state.end() && !idx->is_null() && !(idx->is_array() && idx->empty()))
    throw UsageError(ax::str(state_path.string(), ": the dataset has an indices mapping (_indices_data_files), as datasets 1.x saved "
                             "a selection; save it again with datasets 2 or newer, which writes the selected rows"));
  if (path_exists(info_path)) check_features(read_json(info_path, "datasets' dataset_info.json").value("features", nlohmann::json()), info_path);
  const auto files = state.find("_data_files");
  if (files == state.end() || !files->is_array() || files->empty())
    throw UsageError(ax::str(state_path.string(), ": no _data_files (a list of {\"filename\": ...})"));
  SplitSource s;
  s.names.push_back("train");
  if (auto split = state.find("_split"); split != state.end() && split->is_string() && split->get<std::string>() != "train")
    s.names.push_back(split->get<std::string>());
  for (const auto& f : *files) {
    if (!f.is_object() || !f.contains("filename")) throw UsageError(ax::str(state_path.string(), ": a _data_files entry has no filename"));
    s.files.push_back(arrow_file(dir, plain_name(f["filename"], state_path, "_data_files' filename"), state_path));
  }
  // set_format(columns=...) before saving: load_from_disk's rows have those columns only (unless
  // output_all_columns).
  const auto cols = state.find("_format_columns");
  const bool all = state.value("_output_all_columns", false) == true;
  if (cols != state.end() && cols->is_array() && !all)
    for (const auto& c : *cols)
      if (c.is_string()) s.columns.push_back(c.get<std::string>());
  return s;
}

std::string snake_case(const std::string& name) {  // datasets' camelcase_to_snakecase
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool upper = std::isupper(static_cast<unsigned char>(c));
    if (upper && i > 0) {
      const char p = name[i - 1];
      const bool next_lower = i + 1 < name.size() && std::islower(static_cast<unsigned char>(name[i + 1]));
      if (std::islower(static_cast<unsigned char>(p)) || std::isdigit(static_cast<unsigned char>(p)) ||
          (std::isupper(static_cast<unsigned char>(p)) && next_lower))
        out += '_';
    }
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// A directory of the datasets cache: dataset_info.json's splits, each in <name>-<split>.arrow or its shards.
std::vector<SplitSource> cached_dataset(const fs::path& dir, const nlohmann::json& info) {
  const fs::path info_path = dir / "dataset_info.json";
  check_features(info.value("features", nlohmann::json()), info_path);
  const auto& splits = info["splits"];
  std::vector<SplitSource> out;
  for (const auto& [name, split] : splits.items()) {
    if (!split.is_object()) throw UsageError(ax::str(info_path.string(), ": splits.", name, " is not an object"));
    std::string dataset = split.value("dataset_name", std::string());
    if (dataset.empty()) dataset = info.value("dataset_name", std::string());
    if (dataset.empty()) dataset = info.value("builder_name", std::string());
    if (dataset.empty() || dataset.find('/') != std::string::npos || dataset == "..")
      throw UsageError(ax::str(info_path.string(), ": splits.", name, " names no dataset (dataset_name or builder_name)"));
    for (char c : name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'))
        throw UsageError(ax::str(info_path.string(), ": split name \"", name, "\" is not a datasets split name"));
    const std::string prefix = snake_case(dataset) + "-" + name;
    SplitSource s;
    s.names.push_back(name);
    if (auto n = split.find("num_examples"); n != split.end() && n->is_number_integer()) s.expected_rows = n->get<int64_t>();
    const auto shards = split.find("shard_lengths");
    const std::size_t count = shards != split.end() && shards->is_array() ? shards->size() : 0;
    if (count > 1) {
      if (count > 100000) throw UsageError(ax::str(info_path.string(), ": splits.", name, " lists too many shards"));
      for (std::size_t i = 0; i < count; ++i) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.arrow", i, count);
        s.files.push_back(arrow_file(dir, prefix + buf, info_path));
      }
    } else {
      s.files.push_back(arrow_file(dir, prefix + ".arrow", info_path));
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) throw UsageError(ax::str(info_path.string(), ": no splits"));
  return out;
}

}  // namespace

const SplitSource* DatasetSource::find(const std::string& name) const {
  for (const auto& s : splits)
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) return &s;
  return nullptr;
}

std::string DatasetSource::names() const {
  std::vector<std::string> n;
  for (const auto& s : splits) n.push_back(s.names.front());
  return join(n, ", ");
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return !is_glob(path) && fs::is_directory(path, ec);
}

DatasetSource open_dataset_source(const std::string& path) {
  DatasetSource src;
  src.path = path;
  if (!is_directory(path)) {
    src.layout = "data files";
    SplitSource s;
    s.names.push_back("train");
    for (const auto& p : expand_data_path(path)) s.files.push_back({p, detect_format(p)});
    src.splits.push_back(std::move(s));
    return src;
  }
  const fs::path dir(path);
  if (path_exists(dir / "dataset_dict.json")) {
    src.layout = "a DatasetDict saved by datasets (save_to_disk)";
    src.named = true;
    const fs::path dd = dir / "dataset_dict.json";
    const nlohmann::json j = read_json(dd, "datasets' dataset_dict.json");
    for (const auto& [k, v] : j.items())
      if (k != "splits") throw UsageError(ax::str(dd.string(), ": key '", k, "' is unknown: ", kNewer));
    const auto splits = j.find("splits");
    if (splits == j.end() || !splits->is_array() || splits->empty())
      throw UsageError(ax::str(dd.string(), ": no splits (a list of split names)"));
    for (const auto& n : *splits) {
      const std::string name = plain_name(n, dd, "a split name");
      const fs::path sub = dir / name;
      if (!path_exists(sub / "state.json"))
        throw UsageError(ax::str(dd.string(), " lists split ", name, ", but ", sub.string(), "/state.json is missing: the dataset is "
                                 "incomplete (a save that did not finish?); save it again"));
      SplitSource s = saved_dataset(sub);
      s.names = {name};
      src.splits.push_back(std::move(s));
    }
    return src;
  }
  if (path_exists(dir / "state.json")) {
    src.layout = "a Dataset saved by datasets (save_to_disk)";
    src.splits.push_back(saved_dataset(dir));
    return src;
  }
  if (path_exists(dir / "dataset_info.json")) {
    const nlohmann::json info = read_json(dir / "dataset_info.json", "datasets' dataset_info.json");
    if (info.contains("splits") && info["splits"].is_object()) {
      src.layout = "a directory of the HF datasets cache";
      src.named = true;
      src.splits = cached_dataset(dir, info);
      return src;
    }
  }
  const std::string name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  if (name.size() > 11 && name.compare(name.size() - 11, 11, ".incomplete") == 0)
    throw UsageError(ax::str(path, ": a load_dataset that did not finish (datasets writes into <hash>.incomplete and renames it "
                             "when done); load the dataset again"));
  throw UsageError(ax::str(path, ": a directory, but not one HF datasets wrote: it has no dataset_dict.json (DatasetDict.save_to_disk), "
                           "no state.json (Dataset.save_to_disk) and no dataset_info.json with splits (the datasets cache); "
                           "name the data files instead (a glob reads several: data/*.parquet)"));
}

std::vector<std::string> dataset_dir_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2)) {
      out.push_back(it->path().string());
    } else if (it->is_directory(e2)) {
      std::error_code e3;
      for (fs::directory_iterator sub(it->path(), e3), send; !e3 && sub != send; sub.increment(e3))
        if (std::error_code e4; sub->is_regular_file(e4)) out.push_back(sub->path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ax::data
