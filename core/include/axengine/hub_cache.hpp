// Models where users keep them: a model is named by its directory, or by its Hugging Face hub ID
// ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B@<branch, tag or commit>") when it was downloaded earlier (hf download,
// transformers, vLLM ...) into the hub cache. Resolved offline, by the layout huggingface_hub writes:
//   <cache>/models--<org>--<name>/refs/<revision>        the commit a branch or tag points to
//   <cache>/models--<org>--<name>/snapshots/<commit>/    the files, symlinks into blobs/
//   <cache>/models--<org>--<name>/blobs/<hash>[.incomplete]
// where <cache> is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (huggingface_hub's own order).
// docs/models.md, "Model paths".
#pragma once
#include <optional>
#include <string>

namespace ax::hub {

// The hub cache directory and what chose it ("HF_HUB_CACHE", "HF_HOME", "the default").
struct CacheDir {
  std::string path;
  std::string source;
};
CacheDir cache_dir();

// A hub model ID as huggingface_hub accepts one: "org/name" (letters, digits, '-', '_', '.'; neither part starts
// or ends with '-' or '.', no "--" or "..", at most 96 characters each), optionally "@revision".
struct RepoId {
  std::string repo;      // "org/name"
  std::string revision;  // "main" when not given
};
std::optional<RepoId> parse_repo_id(const std::string& text);

// The directory of the model `given` names: the directory itself (relative to base_dir when relative), or, when
// there is no such directory and `given` is a hub ID, its complete snapshot in the hub cache. When neither is
// found, `given` as it was resolved (a hub ID unchanged): require_model_dir says why. For reading a config,
// which commands that never load the model also read.
std::string find_model_dir(const std::string& given, const std::string& base_dir);

// As find_model_dir, but a model that is not there is a UsageError naming what was looked for and where (the
// directory, the cache directory and the variable that chose it) or, for a partial snapshot, the files missing
// and the downloads that did not finish (blobs/*.incomplete).
std::string require_model_dir(const std::string& given, const std::string& base_dir = "");

// "org/name" when `dir` is a snapshot of the hub cache layout (".../models--org--name/snapshots/<commit>"),
// with "@<commit>" unless refs/main points to that commit; "" otherwise. What to tell a user to pass back.
std::string repo_id_of_snapshot(const std::string& dir);

}  // namespace ax::hub
