// Config keys a user brings from elsewhere: axolotl's (and the Trainer's and peft's) names get a "did you mean"
// naming axengine's key, in any table and inside [[datasets]]; docs/config.md's "From axolotl" table is the code's;
// and --set reaches list elements and [[datasets]] entries by index.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "config/foreign_keys.hpp"
#include "test_util.hpp"

using namespace ax_test;

namespace {

// Loads `text` as run.toml with `sets`; the error message from "run.toml" on ("" when it loaded).
std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  TempDir dir;
  write_file(dir / "run.toml", text);
  try {
    ax::load_config(dir / "run.toml", sets);
  } catch (const ax::ConfigError& e) {
    std::string msg = e.what();
    auto pos = msg.find("run.toml");
    return pos == std::string::npos ? msg : msg.substr(pos);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: axolotl's key names are refused with axengine's key, at the top level and in the wrong table") {
  CHECK(error_of("learning_rate = 2e-4\n") ==
        "run.toml:1:1: unknown key 'learning_rate' (did you mean 'train.lr'? learning_rate is axolotl's name for it; "
        "docs/config.md, \"From axolotl\")");
  CHECK(error_of("[train]\nlearning_rate = 2e-4\n").find("unknown key 'train.learning_rate' (did you mean 'train.lr'?") != std::string::npos);
  CHECK(error_of("[lora]\nlora_r = 8\n").find("unknown key 'lora.lora_r' (did you mean 'lora.r'?") != std::string::npos);
  CHECK(error_of("bf16 = true\n").find("(did you mean model.dtype = \"bf16\"? bf16 is axolotl's name for it") != std::string::npos);
  CHECK(error_of("num_train_epochs = 3\n").find("'train.num_epochs'? num_train_epochs is transformers's name") != std::string::npos);
  CHECK(error_of("load_in_8bit = true\n").find("load_in_8bit is axolotl's key: 8-bit bases are not supported") != std::string::npos);
  // axolotl's optimizer is a string at the top level, where axengine has an [optimizer] table.
  CHECK(error_of("optimizer = \"adamw_torch\"\n") ==
        "run.toml:1:13: 'optimizer' must be a table, not a string (did you mean 'train.optimizer'? optimizer is axolotl's name "
        "for it (adamw); docs/config.md, \"From axolotl\")");
  // Inside a [[datasets]] entry, an axolotl datasets entry's own keys.
  const std::string entry = "[[datasets]]\ntype = \"alpaca\"\npath = \"a.jsonl\"\n";
  CHECK(error_of(entry + "ds_type = \"json\"\n").find("unknown key 'datasets.ds_type' (ds_type is axolotl's key: the file's extension") !=
        std::string::npos);
  CHECK(error_of(entry + "field_instruction = \"q\"\n").find("(did you mean 'datasets[].instruction_field'?") != std::string::npos);
  // Every common axolotl key of issue 36 names ours; an unrelated misspelling keeps the closest-key hint.
  for (const char* key : {"learning_rate", "num_epochs", "num_train_epochs", "lora_r", "lora_alpha", "lora_dropout",
                          "lora_target_modules", "micro_batch_size", "gradient_accumulation_steps", "sequence_len", "base_model",
                          "output_dir", "warmup_steps", "lr_scheduler", "weight_decay", "bf16", "gradient_checkpointing",
                          "val_set_size", "save_steps", "eval_steps", "max_steps", "seed", "load_in_4bit", "adapter"}) {
    CAPTURE(key);
    const std::string e = error_of(std::string(key) + " = 1\n");
    CHECK(e.rfind(std::string("run.toml:1:1: unknown key '") + key + "' (", 0) == 0);
    CHECK(e.find("docs/config.md, \"From axolotl\"") != std::string::npos);
  }
  CHECK(error_of("[run]\nsede = 3\n") == "run.toml:2:1: unknown key 'run.sede' (did you mean 'run.seed'?)");
}

TEST_CASE("config: docs/config.md's From axolotl table is the one the binder uses") {
  const std::string doc = read_file(std::string(AXENGINE_SOURCE_DIR) + "/docs/config.md");
  const std::string begin = "<!-- BEGIN FOREIGN KEYS -->\n", end = "<!-- END FOREIGN KEYS -->";
  const auto b = doc.find(begin), e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  CHECK(doc.substr(b + begin.size(), e - b - begin.size()) == ax::foreign_keys_markdown());
}

TEST_CASE("config: --set reaches [[datasets]] entries and list elements by index, and refuses an index out of range") {
  const std::string two = "[[datasets]]\ntype = \"completion\"\npath = \"a.jsonl\"\n[[datasets]]\ntype = \"completion\"\npath = \"b.jsonl\"\n"
                          "[lora]\ntargets = [\"q_proj\", \"v_proj\"]\n";
  TempDir dir;
  write_file(dir / "run.toml", two);
  auto c = ax::load_config(dir / "run.toml", {"datasets[1].path=c.jsonl", "datasets[0].eval_fraction=0.25", "lora.targets[1]=k_proj"});
  const toml::array& entries = *c.document.get("datasets")->as_array();
  CHECK(entries.get(0)->as_table()->get("path")->value<std::string>() == "a.jsonl");
  CHECK(entries.get(1)->as_table()->get("path")->value<std::string>() == "c.jsonl");
  CHECK(entries.get(0)->as_table()->get("eval_fraction")->value<double>() == 0.25);
  const toml::array& targets = *c.document.at_path("lora.targets").as_array();
  CHECK(targets.get(1)->value<std::string>() == "k_proj");
  // Overrides are validated like the file.
  CHECK(error_of(two, {"datasets[0].eval_fracton=0.1"}).find("unknown key 'datasets.eval_fracton'") != std::string::npos);
  CHECK(error_of(two, {"datasets[2].path=x.jsonl"}) ==
        "--set 'datasets[2].path=x.jsonl': index 2 is out of range: 'datasets' has 2 entries (datasets[0] to datasets[1])");
  CHECK(error_of(two, {"lora.targets[5]=x"}).find("index 5 is out of range: 'lora.targets' has 2 entries") != std::string::npos);
  CHECK(error_of(two, {"lora[0].r=4"}).find("'lora' is not a list") != std::string::npos);
  CHECK(error_of("[run]\n", {"datasets[0].path=x"}).find("'datasets' is not in the config") != std::string::npos);
  CHECK(error_of(two, {"datasets[x].path=y"}).find("'datasets[x]' is not a key or key[index]") != std::string::npos);
}
