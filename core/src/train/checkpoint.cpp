#include "train/checkpoint.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "atomic_dir.hpp"
#include "axengine/crash_point.hpp"
#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "train/checkpoint_manifest.hpp"

namespace fs = std::filesystem;

namespace ax::train {
namespace {

constexpr const char* kStateTensors = "trainer_state.safetensors";
constexpr const char* kStateJson = "trainer_state.json";
constexpr const char* kStateFormat = "axengine-trainer-state-v1";

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// The N of a directory named step-N (digits only: "step--0000004" is not one).
std::optional<int64_t> parse_step_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return std::nullopt;
  for (std::size_t i = 5; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return std::nullopt;
  return std::stoll(name.substr(5));
}

// Directories named step-N under `root`, oldest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (auto step = parse_step_name(e.path().filename().string()); step && e.is_directory(ec))
      out.emplace_back(*step, e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// What a process that died while saving or pruning left behind (.tmp-, .old-, .trash- directories).
void remove_leftovers(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> gone;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".old-", 0) == 0 || name.rfind(".trash-", 0) == 0)
      gone.push_back(e.path().string());
  }
  for (const auto& p : gone) remove_tree(p);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(str(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string checkpoints_dir(const std::string& output_dir) { return (fs::path(output_dir) / "checkpoints").string(); }

std::string save_checkpoint(const std::string& output_dir, int64_t step, const CheckpointPayload& payload, int64_t keep_last) {
  const std::string root = checkpoints_dir(output_dir);
  fs::create_directories(root);
  remove_leftovers(root);
  const std::string final_dir = (fs::path(root) / step_name(step)).string();
  AtomicDir dir(final_dir, "checkpoint");

  if (payload.write_adapter) payload.write_adapter(dir.path());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : payload.params) tensors.emplace_back("param/" + name, t.detach());
  for (const auto& [name, t] : payload.optimizer) tensors.emplace_back("optim/" + name, t.detach());
  for (const auto& [name, t] : payload.rng) tensors.emplace_back("rng/" + name, t);
  safetensors::save((fs::path(dir.path()) / kStateTensors).string(), tensors, {{"format", kStateFormat}}, "checkpoint");
  safetensors::write_file_atomic((fs::path(dir.path()) / kStateJson).string(), payload.state.to_json().dump(2) + "\n",
                                 "checkpoint");
  write_manifest(dir.path(), "checkpoint");  // last: it lists the files above
  dir.commit();

  // Pruning renames first: a checkpoint is never seen half-deleted, whenever the process dies.
  auto all = list_checkpoints(root);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last) < all.size(); ++i) {
    if (all[i].second == final_dir) continue;
    const std::string trash = (fs::path(root) / (".trash-" + step_name(all[i].first))).string();
    remove_tree(trash);
    if (::rename(all[i].second.c_str(), trash.c_str()) != 0) continue;  // left for the next save to prune
    crash_point("checkpoint", "prune_renamed");
    remove_tree(trash);
    crash_point("checkpoint", "prune_removed");
  }
  return final_dir;
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  LoadedCheckpoint out;
  out.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError(str(dir, ": not a checkpoint directory"));
  const fs::path d(dir);
  const std::string json_path = (d / kStateJson).string(), tensors_path = (d / kStateTensors).string();
  out.has_manifest = verify_manifest(dir, {kStateJson, kStateTensors});
  if (!out.has_manifest) {
    if (!fs::exists(json_path, ec))
      throw UsageError(str(dir, ": not a checkpoint (no ", kManifestFile, ", no ", kStateJson, ")"));
    log::warn(str(dir, ": no ", kManifestFile, " (written before checkpoints carried one): its files cannot be checksummed, "
                  "only checked for structure"));
  }

  auto j = nlohmann::json::parse(read_text(json_path), nullptr, false);
  if (j.is_discarded()) throw UsageError(str(json_path, ": not valid JSON"));
  fs::path canon = d.lexically_normal();
  if (!canon.has_filename()) canon = canon.parent_path();
  out.state = parse_trainer_state(j, json_path, parse_step_name(canon.filename().string()));

  auto f = safetensors::File::open(tensors_path);
  if (auto it = f->metadata().find("format"); it == f->metadata().end() || it->second != kStateFormat)
    throw UsageError(str(tensors_path, ": not a trainer state (metadata format is not \"", kStateFormat, "\")"));
  for (const auto& info : f->tensors()) {
    auto slash = info.name.find('/');
    std::string kind = info.name.substr(0, slash), name = slash == std::string::npos ? "" : info.name.substr(slash + 1);
    if (kind == "param") out.params[name] = f->get(info.name);
    else if (kind == "optim") out.optimizer[name] = f->get(info.name);
    else if (kind == "rng") out.rng[name] = f->get(info.name);
    else throw UsageError(str(f->path(), ": unexpected tensor '", info.name, "'"));
  }
  // Without a manifest, the adapter is at least checked for structure (a truncated file fails here).
  if (!out.has_manifest && fs::exists(d / "adapter_model.safetensors", ec))
    safetensors::File::open((d / "adapter_model.safetensors").string());
  return out;
}

LatestCheckpoint load_latest_checkpoint(const std::string& output_dir) {
  LatestCheckpoint out;
  auto all = list_checkpoints(checkpoints_dir(output_dir));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      out.loaded = load_checkpoint(it->second);
      return out;
    } catch (const std::exception& e) {  // UsageError from the checks; anything else reading a damaged file
      out.skipped.emplace_back(it->second, e.what());
    }
  }
  return out;
}

std::string find_latest_checkpoint(const std::string& output_dir) {
  auto latest = load_latest_checkpoint(output_dir);
  return latest.loaded ? latest.loaded->dir : std::string();
}

}  // namespace ax::train
