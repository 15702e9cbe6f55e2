// Keys of other fine-tuning tools' configs (axolotl's, and the Hugging Face Trainer's and peft's names that axolotl
// passes through) that a config converted from theirs may carry: an unknown key among them gets a hint naming
// axengine's key instead of only "unknown key" (docs/config.md, "From axolotl", holds the same table).
#pragma once
#include <string>
#include <vector>

namespace ax {

struct ForeignKey {
  std::string name;        // their key, as written in their config ("learning_rate")
  std::string from;        // whose: "axolotl", or "transformers" / "peft" (names axolotl passes through)
  bool dataset_entry;      // a key of one of their `datasets` entries (checked only inside [[datasets]])
  std::string ours;        // axengine's key ("train.lr") or setting ("model.dtype = \"bf16\""); "" when none
  std::string note;        // why, or what to do instead when `ours` is empty
};

const std::vector<ForeignKey>& foreign_keys();

// The hint for an unknown `key` in the table at `table_path` ("" = the top level, "datasets" = a [[datasets]]
// entry), e.g. "did you mean 'train.lr'? learning_rate is axolotl's name for it; ...", or "" when `key` is not one.
std::string foreign_key_hint(const std::string& table_path, const std::string& key);

// The table docs/config.md shows under "From axolotl" (between its FOREIGN KEYS markers; config_test compares).
std::string foreign_keys_markdown();

}  // namespace ax
