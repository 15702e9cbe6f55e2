// See tuning_cache.hpp.
#include "tuning_cache.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include <axengine/log.hpp>
#include <axengine/safetensors.hpp>
#include <axengine/strings.hpp>

#include "../kernels/tile_configs.hpp"

namespace ax::scattermoe {
namespace fs = std::filesystem;

namespace {
constexpr int kFormatVersion = 1;
constexpr GemmOp kOps[] = {GemmOp::forward, GemmOp::dx, GemmOp::thin, GemmOp::lora_add, GemmOp::gram};

std::optional<int64_t> parse_field(std::string_view part, std::string_view name) {
  if (part.size() <= name.size() + 1 || part.substr(0, name.size()) != name || part[name.size()] != '=')
    return std::nullopt;
  const std::string_view num = part.substr(name.size() + 1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (ec != std::errc() || p != num.data() + num.size() || v < 0) return std::nullopt;
  return v;
}

// A tile name valid for the op's family.
bool valid_entry(const std::string& key, const std::string& tile) {
  const auto k = parse_key(key);
  const int id = tile_id(tile);
  if (!k || id < 0) return false;
  const TileFamily want = k->op == GemmOp::gram ? TileFamily::gram : TileFamily::grouped;
  return kTileConfigs[id].family == want;
}
}  // namespace

const char* to_string(GemmOp op) {
  switch (op) {
    case GemmOp::forward: return "forward";
    case GemmOp::dx: return "dx";
    case GemmOp::thin: return "thin";
    case GemmOp::lora_add: return "lora_add";
    case GemmOp::gram: return "gram";
  }
  return "?";
}

std::optional<GemmOp> parse_gemm_op(std::string_view text) {
  for (GemmOp op : kOps)
    if (text == to_string(op)) return op;
  return std::nullopt;
}

int64_t bucket_rows(int64_t m) {
  if (m <= 0) return 0;
  int64_t b = 1;
  while (b < m && b < (int64_t{1} << 62)) b <<= 1;
  return b;
}

std::string TuningKey::str() const {
  return ax::str(gpu, "|", to_string(op), "|E=", E, "|M=", bucket_rows(M), "|N=", N, "|K=", K, "|r=", r);
}

std::optional<TuningKey> parse_key(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t bar = text.find('|', start);
    parts.push_back(text.substr(start, bar == std::string_view::npos ? std::string_view::npos : bar - start));
    if (bar == std::string_view::npos) break;
    start = bar + 1;
  }
  if (parts.size() != 7 || parts[0].empty()) return std::nullopt;
  TuningKey k;
  k.gpu = std::string(parts[0]);
  const auto op = parse_gemm_op(parts[1]);
  const auto E = parse_field(parts[2], "E"), M = parse_field(parts[3], "M"), N = parse_field(parts[4], "N"),
             K = parse_field(parts[5], "K"), r = parse_field(parts[6], "r");
  if (!op || !E || !M || !N || !K || !r) return std::nullopt;
  if (bucket_rows(*M) != *M) return std::nullopt;  // written keys carry bucketed rows
  k.op = *op;
  k.E = *E;
  k.M = *M;
  k.N = *N;
  k.K = *K;
  k.r = *r;
  return k;
}

fs::path default_user_cache_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "axengine" / "scattermoe-tuning.json";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "axengine" / "scattermoe-tuning.json";
  return {};
}

std::map<std::string, std::string> TuningCache::read_file(const fs::path& file, std::string& warning) {
  warning.clear();
  std::map<std::string, std::string> out;
  std::error_code ec;
  if (!fs::exists(file, ec)) return out;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    warning = ax::str("scattermoe: tuning cache ", file.string(), ": cannot be read; ignored");
    return out;
  }
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    warning = ax::str("scattermoe: tuning cache ", file.string(), doc.is_discarded() ? ": not valid JSON" : ": not a JSON object",
                      "; ignored");
    return out;
  }
  const auto ver = doc.find("version");
  const auto entries = doc.find("entries");
  if (ver == doc.end() || !ver->is_number_integer() || ver->get<int>() != kFormatVersion || entries == doc.end() ||
      !entries->is_object()) {
    warning = ax::str("scattermoe: tuning cache ", file.string(), ": expected {\"version\": ", kFormatVersion,
                      ", \"entries\": {...}}; ignored");
    return out;
  }
  size_t bad = 0;
  std::string first_bad;
  for (auto it = entries->begin(); it != entries->end(); ++it) {
    if (it.value().is_string() && valid_entry(it.key(), it.value().get<std::string>())) {
      out[it.key()] = it.value().get<std::string>();
    } else {
      if (bad++ == 0) first_bad = it.key();
    }
  }
  if (bad > 0)
    warning = ax::str("scattermoe: tuning cache ", file.string(), ": ignored ", bad,
                      " unknown or invalid entr", bad == 1 ? "y" : "ies", " (first: '", first_bad,
                      "'; written by another version?)");
  return out;
}

void TuningCache::write_file(const fs::path& file, const std::map<std::string, std::string>& entries) {
  nlohmann::json doc = {{"version", kFormatVersion}, {"entries", nlohmann::json::object()}};
  for (const auto& [k, v] : entries) doc["entries"][k] = v;
  const std::string text = doc.dump(2) + "\n";
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  // Readers see the old file or the new one, never a mix, whenever this process dies; the temp file's name is
  // unique, so concurrent writers never share one. Crash points: tuning_cache.file_*.
  ax::safetensors::write_file_atomic(file.string(), text, "tuning_cache");
}

void TuningCache::warn(const std::string& message) {
  warnings_.push_back(message);
  ax::log::warn(message);
}

void TuningCache::load_shipped_dir(const fs::path& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  std::vector<fs::path> files;
  for (const auto& de : fs::directory_iterator(dir, ec))
    if (de.path().extension() == ".json") files.push_back(de.path());
  std::sort(files.begin(), files.end());  // deterministic precedence: later names win on duplicates
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : files) {
    std::string w;
    for (auto& [k, v] : read_file(f, w)) shipped_[k] = v;
    if (!w.empty()) warn(w);
  }
}

void TuningCache::load_user(const fs::path& file) {
  std::lock_guard<std::mutex> lock(mu_);
  user_file_ = file;
  if (file.empty()) return;
  std::string w;
  for (auto& [k, v] : read_file(file, w)) user_[k] = v;
  if (!w.empty()) warn(w);
}

std::optional<std::string> TuningCache::lookup(const std::string& key, bool shipped) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = user_.find(key); it != user_.end()) return it->second;
  if (shipped)
    if (auto it = shipped_.find(key); it != shipped_.end()) return it->second;
  return std::nullopt;
}

void TuningCache::store(const std::string& key, const std::string& tile) {
  std::lock_guard<std::mutex> lock(mu_);
  user_[key] = tile;
}

bool TuningCache::save() {
  std::lock_guard<std::mutex> lock(mu_);
  if (user_file_.empty()) return false;
  std::string w;  // the file's current warnings were reported when it was loaded
  std::map<std::string, std::string> merged = read_file(user_file_, w);
  for (const auto& [k, v] : user_) merged[k] = v;
  try {
    write_file(user_file_, merged);
  } catch (const std::exception& e) {
    warn(ax::str("scattermoe: tuning cache not saved: ", e.what()));
    return false;
  }
  user_ = std::move(merged);
  return true;
}

std::size_t TuningCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = user_.size();
  for (const auto& [k, v] : shipped_) n += user_.count(k) ? 0 : 1;
  return n;
}

std::vector<std::string> TuningCache::warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warnings_;
}

}  // namespace ax::scattermoe
