// A model named by its Hugging Face hub ID, resolved offline in a hub cache (axengine/hub_cache.hpp): the ID and
// revision parser, refs/<revision>, the snapshot's completeness checks (config.json, the index's shards, symlinks
// into blobs/ that may dangle, .incomplete downloads), and repo_id_of_snapshot on what resolved. Whatever the
// input, an ID resolved through the cache is a directory of the repo's snapshots/ (a revision never leads out of
// it), and repo_id_of_snapshot names the same repo back.
//
// Input parts (kSeparator): [0] the ID as written in model.path ("org/name@revision"), [1] refs/main, [2] the
// snapshot's model.safetensors.index.json ("" = none), [3] the snapshot's entries, one a line: "name" a file,
// "name>" a symlink into blobs/ whose blob is missing, "name~" a blob still downloading (blobs/<name>.incomplete).
// The cache holds models--org--name (the ID's repo when it parses, else "org/name") with one snapshot,
// "0123456789abcdef0123456789abcdef01234567".
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "axengine/hub_cache.hpp"
#include "harness.hpp"

namespace fs = std::filesystem;

AX_FUZZ_HARNESS(hub_snapshot) {
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 4);
  const std::string cache = ax::fuzz::fresh_dir("hub");
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  const std::string given(parts[0]);
  const auto id = ax::hub::parse_repo_id(given);
  std::string repo = id ? id->repo : "org/name";
  repo.replace(repo.find('/'), 1, "--");
  const fs::path root = fs::path(cache) / ("models--" + repo);
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  const fs::path snap = root / "snapshots" / commit;
  fs::create_directories(snap);
  fs::create_directories(root / "refs");
  fs::create_directories(root / "blobs");
  if (parts.size() > 1) ax::fuzz::write_file((root / "refs" / "main").string(), parts[1]);
  if (parts.size() > 2 && !parts[2].empty()) ax::fuzz::write_file((snap / "model.safetensors.index.json").string(), parts[2]);
  if (parts.size() > 3) {
    std::string_view lines = parts[3];
    while (!lines.empty()) {
      const auto nl = lines.find('\n');
      std::string name(lines.substr(0, nl));
      lines = nl == std::string_view::npos ? std::string_view() : lines.substr(nl + 1);
      char mark = name.empty() ? 0 : name.back();
      if (mark == '>' || mark == '~') name.pop_back();
      // Plain names only: the harness writes inside the snapshot, nowhere else.
      if (name.empty() || name.size() > 64 || name.find('/') != std::string::npos || name == "." || name == ".." ||
          name.find('\0') != std::string::npos)
        continue;
      std::error_code ec;
      if (mark == '>' || mark == '~') {
        fs::create_symlink("../../blobs/" + name, snap / name, ec);
        if (mark == '~') ax::fuzz::write_file((root / "blobs" / (name + ".incomplete")).string(), "partial");
      } else {
        ax::fuzz::write_file((snap / name).string(), "{}");
      }
    }
  }
  // Relative to an empty directory: a local directory is found only where `given` leads out of it (".."), and
  // then the cache was not asked.
  const std::string base = ax::fuzz::fresh_dir("base");
  std::error_code ec;
  const bool local = fs::is_directory(fs::path(given).is_absolute() ? fs::path(given) : fs::path(base) / given, ec);
  const std::string dir = ax::hub::require_model_dir(given, base);
  if (local) return;
  if (!id || fs::weakly_canonical(dir).parent_path() != fs::weakly_canonical(root / "snapshots")) std::abort();
  const std::string back = ax::hub::repo_id_of_snapshot(dir);
  const auto again = ax::hub::parse_repo_id(back);
  if (!again || again->repo != id->repo) std::abort();
}
