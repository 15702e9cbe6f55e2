#include "axengine/hub_cache.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"

namespace fs = std::filesystem;

namespace ax::hub {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// os.path.expandvars + expanduser, as huggingface_hub applies them to HF_HOME and HF_HUB_CACHE: $NAME and
// ${NAME} of set variables are replaced (others stay as written), a leading ~ is $HOME.
std::string expand(const std::string& p) {
  std::string out;
  for (std::size_t i = 0; i < p.size();) {
    if (p[i] != '$') {
      out += p[i++];
      continue;
    }
    std::size_t b = i + 1, e = b;
    const bool braced = b < p.size() && p[b] == '{';
    if (braced) e = ++b;
    while (e < p.size() && (std::isalnum(static_cast<unsigned char>(p[e])) || p[e] == '_')) ++e;
    const std::string name = p.substr(b, e - b);
    const bool closed = !braced || (e < p.size() && p[e] == '}');
    const char* value = name.empty() || !closed ? nullptr : std::getenv(name.c_str());
    if (!value) {
      out += p[i++];
      continue;
    }
    out += value;
    i = braced ? e + 1 : e;
  }
  if (!out.empty() && out[0] == '~' && (out.size() == 1 || out[1] == '/')) out = env("HOME") + out.substr(1);
  return out;
}

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// A regular file, following symlinks: a snapshot's entry whose blob is gone is not one.
bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool is_commit(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); });
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }

// One part of a repo ID (huggingface_hub's REPO_ID_REGEX and validate_repo_id).
bool valid_part(const std::string& s) {
  if (s.empty() || s.size() > 96) return false;
  if (!std::all_of(s.begin(), s.end(), name_char)) return false;
  if (s.front() == '-' || s.front() == '.' || s.back() == '-' || s.back() == '.') return false;
  return s.find("--") == std::string::npos && s.find("..") == std::string::npos;
}

std::string repo_folder(const RepoId& id) {
  std::string r = id.repo;
  return "models--" + r.replace(r.find('/'), 1, "--");
}

std::string format_bytes(std::uintmax_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? ax::str(n, " bytes") : ax::str(static_cast<double>(static_cast<int64_t>(v * 10 + 0.5)) / 10, " ", units[u]);
}

// What a snapshot lacks to be loaded: config.json, and the weights (every shard its index names, else a
// *.safetensors file). Empty when complete.
std::vector<std::string> snapshot_missing(const fs::path& snap) {
  std::vector<std::string> missing;
  if (!is_file(snap / "config.json")) missing.push_back("config.json");
  const fs::path index = snap / "model.safetensors.index.json";
  if (is_file(index)) {
    nlohmann::json j = nlohmann::json::parse(read_regular_file(index.string(), "checkpoint index"), nullptr, false);
    const auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) {
      missing.push_back("a readable model.safetensors.index.json (its weight_map)");
      return missing;
    }
    std::set<std::string> shards;
    for (const auto& [name, file] : map->items())
      if (file.is_string()) shards.insert(file.get<std::string>());
    for (const auto& s : shards)
      if (s.find("..") != std::string::npos || !is_file(snap / s)) missing.push_back(s);
    return missing;
  }
  bool weights = false;
  std::error_code ec;
  for (fs::directory_iterator it(snap, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors" && is_file(it->path())) weights = true;
  if (!weights) missing.push_back("model.safetensors (or model.safetensors.index.json and its shards)");
  return missing;
}

// The downloads of this repo that did not finish: blobs/*.incomplete, with their sizes.
std::vector<std::string> incomplete_blobs(const fs::path& repo) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(repo / "blobs", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".incomplete") continue;
    std::error_code sec;
    const auto size = fs::file_size(it->path(), sec);
    out.push_back(ax::str("blobs/", it->path().filename().string(), sec ? std::string() : ax::str(" (", format_bytes(size), ")")));
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Lookup {
  std::string dir;    // the complete snapshot; empty: not found
  std::string error;  // why not, when it is a hub ID
};

// The snapshot of `id` in the hub cache, or what is wrong.
Lookup find_in_cache(const RepoId& id) {
  const CacheDir cache = cache_dir();
  const fs::path repo = fs::path(cache.path) / repo_folder(id);
  const std::string where = ax::str("the Hugging Face hub cache ", cache.path, " (", cache.source, ")");
  const std::string get = ax::str("download it first (`hf download ", id.repo, id.revision == "main" ? "" : " --revision " + id.revision,
                                  "`, or any transformers/huggingface_hub call that fetches it), or set HF_HUB_CACHE or HF_HOME to the cache that holds it");
  if (!is_dir(repo.string()))
    return {"", ax::str("not in ", where, ": looked for ", repo.string(), "; ", get)};
  std::string commit = id.revision;
  const fs::path ref = repo / "refs" / id.revision;
  if (is_file(ref)) {
    commit = read_regular_file(ref.string(), "hub cache ref");
    while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  }
  // A commit names one directory of snapshots/: whatever refs/ holds, nothing outside it.
  const bool plain = !commit.empty() && commit != "." && commit != ".." && commit.find_first_of(std::string("/\0", 2)) == std::string::npos;
  const fs::path snap = repo / "snapshots" / (plain ? commit : std::string("?"));
  if (!plain || !is_dir(snap.string())) {
    std::vector<std::string> cached;
    std::error_code ec;
    for (fs::directory_iterator it(repo / "snapshots", ec), end; !ec && it != end; it.increment(ec))
      cached.push_back(it->path().filename().string());
    std::sort(cached.begin(), cached.end());
    const std::string what = is_file(ref) ? ax::str("refs/", id.revision, " points to ", commit, ", whose snapshot is not there")
                             : is_commit(id.revision) ? ax::str("no snapshot of commit ", id.revision)
                                                       : ax::str("no revision '", id.revision, "' (looked for ", ref.string(), ")");
    return {"", ax::str(id.repo, " is in ", where, " but has ", what, "; cached snapshots: ",
                        cached.empty() ? std::string("none") : join(cached, ", "), "; ", get)};
  }
  const auto missing = snapshot_missing(snap);
  if (!missing.empty()) {
    const auto partial = incomplete_blobs(repo);
    return {"", ax::str(id.repo, ": the snapshot ", snap.string(), " in ", where, " is incomplete: ", join(missing, ", "),
                        missing.size() == 1 ? " is" : " are", " missing",
                        partial.empty() ? std::string() : ax::str(" (downloads that did not finish: ", join(partial, ", "), ")"),
                        "; finish the download (`hf download ", id.repo, id.revision == "main" ? "" : " --revision " + id.revision, "`)")};
  }
  return {snap.string(), ""};
}

Lookup lookup(const std::string& given, const std::string& base_dir) {
  const fs::path p(given);
  const std::string local = p.is_absolute() || base_dir.empty() ? given : (fs::path(base_dir) / p).lexically_normal().string();
  if (is_dir(local)) return {local, ""};
  std::error_code ec;
  const std::string shown = fs::absolute(local, ec).lexically_normal().string();  // where, from any working directory
  const auto id = p.is_absolute() ? std::nullopt : parse_repo_id(given);
  if (!id) {
    return {"", ax::str(shown, fs::exists(local, ec) ? " is not a directory" : " does not exist",
                        " (a Hugging Face model directory: config.json, *.safetensors, tokenizer.json; or a hub ID such as "
                        "Qwen/Qwen3-8B that is in the hub cache)")};
  }
  Lookup l = find_in_cache(*id);
  if (l.dir.empty()) l.error = ax::str("\"", given, "\" is not a directory (looked for ", shown, ") and ", l.error);
  return l;
}

}  // namespace

CacheDir cache_dir() {
  for (const char* var : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})
    if (std::string v = env(var); !v.empty()) return {expand(v), var};
  if (std::string home = env("HF_HOME"); !home.empty()) return {(fs::path(expand(home)) / "hub").string(), "HF_HOME/hub"};
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty())
    return {(fs::path(xdg) / "huggingface" / "hub").string(), "XDG_CACHE_HOME/huggingface/hub"};
  return {(fs::path(env("HOME")) / ".cache" / "huggingface" / "hub").string(), "the default; HF_HUB_CACHE or HF_HOME move it"};
}

std::optional<RepoId> parse_repo_id(const std::string& text) {
  RepoId id;
  const auto at = text.find('@');
  id.repo = text.substr(0, at);
  id.revision = at == std::string::npos ? "main" : text.substr(at + 1);
  const auto slash = id.repo.find('/');
  if (slash == std::string::npos || !valid_part(id.repo.substr(0, slash)) || !valid_part(id.repo.substr(slash + 1))) return std::nullopt;
  // A branch or tag name (refs/<revision> in the cache; "refs/pr/1" has slashes) or a commit; nothing that
  // leaves refs/.
  const std::string& r = id.revision;
  if (!std::all_of(r.begin(), r.end(), [](char c) { return name_char(c) || c == '/'; })) return std::nullopt;
  for (std::size_t b = 0;;) {  // every component a name: none empty, "." or ".."
    const std::size_t e = std::min(r.find('/', b), r.size());
    const std::string c = r.substr(b, e - b);
    if (c.empty() || c == "." || c == "..") return std::nullopt;
    if (e == r.size()) break;
    b = e + 1;
  }
  return id;
}

std::string find_model_dir(const std::string& given, const std::string& base_dir) {
  if (given.empty()) return given;
  Lookup l = lookup(given, base_dir);
  if (!l.dir.empty()) return l.dir;
  const fs::path p(given);
  if (!p.is_absolute() && parse_repo_id(given)) return given;
  return p.is_absolute() || base_dir.empty() ? given : (fs::path(base_dir) / p).lexically_normal().string();
}

std::string require_model_dir(const std::string& given, const std::string& base_dir) {
  if (given.empty()) throw UsageError("no model given (a Hugging Face model directory, or a hub ID such as Qwen/Qwen3-8B)");
  Lookup l = lookup(given, base_dir);
  if (l.dir.empty()) throw UsageError(l.error);
  return l.dir;
}

std::string repo_id_of_snapshot(const std::string& dir) {
  std::error_code ec;
  fs::path snap = fs::weakly_canonical(fs::path(dir), ec);
  if (ec) return "";
  if (!snap.has_filename()) snap = snap.parent_path();
  const std::string commit = snap.filename().string();
  const fs::path snapshots = snap.parent_path(), repo = snapshots.parent_path();
  const std::string folder = repo.filename().string();
  if (snapshots.filename() != "snapshots" || folder.rfind("models--", 0) != 0) return "";
  const std::string rest = folder.substr(8);
  const auto sep = rest.find("--");
  if (sep == std::string::npos) return "";
  const std::string id = rest.substr(0, sep) + "/" + rest.substr(sep + 2);
  if (!parse_repo_id(id)) return "";
  std::string main;
  if (is_file(repo / "refs" / "main")) {
    main = read_regular_file((repo / "refs" / "main").string(), "hub cache ref");
    while (!main.empty() && std::isspace(static_cast<unsigned char>(main.back()))) main.pop_back();
  }
  return main == commit ? id : id + "@" + commit;
}

}  // namespace ax::hub
