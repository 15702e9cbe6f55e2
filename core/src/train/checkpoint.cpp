#include "train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"

namespace fs = std::filesystem;

namespace ax::train {
namespace {

constexpr const char* kStateTensors = "trainer_state.safetensors";
constexpr const char* kStateJson = "trainer_state.json";

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// Complete checkpoints under `root`, oldest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !e.is_directory()) continue;
    try {
      std::size_t used = 0;
      int64_t step = std::stoll(name.substr(5), &used);
      if (used == name.size() - 5) out.emplace_back(step, e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

void fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw RuntimeError(ax::str(path, ": cannot open directory to fsync: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(ax::str(path, ": directory fsync failed: ", std::strerror(errno)));
}

std::string checkpoints_dir(const std::string& output_dir) { return (fs::path(output_dir) / "checkpoints").string(); }

std::string save_checkpoint(const std::string& output_dir, int64_t step, const CheckpointPayload& payload, int64_t keep_last) {
  const std::string root = checkpoints_dir(output_dir);
  fs::create_directories(root);
  const std::string final_dir = (fs::path(root) / step_name(step)).string();
  const std::string tmp = (fs::path(root) / (".tmp-" + step_name(step))).string();
  remove_tree(tmp);  // left over by a run killed while saving
  fs::create_directories(tmp);

  if (payload.write_adapter) payload.write_adapter(tmp);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : payload.params) tensors.emplace_back("param/" + name, t.detach());
  for (const auto& [name, t] : payload.optimizer) tensors.emplace_back("optim/" + name, t.detach());
  for (const auto& [name, t] : payload.rng) tensors.emplace_back("rng/" + name, t);
  safetensors::save((fs::path(tmp) / kStateTensors).string(), tensors, {{"format", "axengine-trainer-state-v1"}});
  // The JSON goes last: its presence (in a renamed directory) is what load_checkpoint checks first.
  safetensors::write_file_atomic((fs::path(tmp) / kStateJson).string(), payload.state.dump(2) + "\n");
  fsync_dir(tmp);

  // Re-saving a step (a resumed run reaching a step it had saved before): move the old one aside first.
  std::error_code ec;
  std::string old;
  if (fs::exists(final_dir, ec)) {
    old = (fs::path(root) / (".old-" + step_name(step))).string();
    remove_tree(old);
    if (::rename(final_dir.c_str(), old.c_str()) != 0) throw RuntimeError(ax::str(final_dir, ": cannot move aside: ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    throw RuntimeError(ax::str(tmp, ": cannot rename to ", final_dir, ": ", std::strerror(errno)));
  fsync_dir(root);
  if (!old.empty()) remove_tree(old);

  auto all = list_checkpoints(root);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last) < all.size(); ++i)
    if (all[i].second != final_dir) remove_tree(all[i].second);
  return final_dir;
}

std::string find_latest_checkpoint(const std::string& output_dir) {
  auto all = list_checkpoints(checkpoints_dir(output_dir));
  return all.empty() ? std::string() : all.back().second;
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  LoadedCheckpoint out;
  out.dir = dir;
  std::string json_path = (fs::path(dir) / kStateJson).string();
  std::ifstream in(json_path);
  if (!in) throw UsageError(ax::str(dir, ": not a checkpoint (no ", kStateJson, ")"));
  std::stringstream ss;
  ss << in.rdbuf();
  out.state = nlohmann::json::parse(ss.str(), nullptr, false);
  if (out.state.is_discarded() || !out.state.is_object() || !out.state.contains("step") || !out.state["step"].is_number_integer())
    throw UsageError(ax::str(json_path, ": unreadable trainer state"));
  auto f = safetensors::File::open((fs::path(dir) / kStateTensors).string());
  for (const auto& info : f->tensors()) {
    auto slash = info.name.find('/');
    std::string kind = info.name.substr(0, slash), name = slash == std::string::npos ? "" : info.name.substr(slash + 1);
    if (kind == "param") out.params[name] = f->get(info.name);
    else if (kind == "optim") out.optimizer[name] = f->get(info.name);
    else if (kind == "rng") out.rng[name] = f->get(info.name);
    else throw UsageError(ax::str(f->path(), ": unexpected tensor '", info.name, "'"));
  }
  return out;
}

}  // namespace ax::train
