// Models named by their Hugging Face hub ID, resolved offline in the hub cache (axengine/hub_cache.hpp): the cache
// directory huggingface_hub itself would use, IDs and revisions (refs/<branch>, a commit), the local directory
// winning over the cache, and what is missing named: the directories looked in, a revision not there, a partial
// snapshot (a missing shard, a symlink whose blob is gone, a download that did not finish). The CLI: run, validate,
// inspect, generate and merge-lora take an ID, a config's model.path too, and an adapter names its base by ID.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/hub_cache.hpp"
#include "test_util.hpp"
#include "unit/tiny_model.hpp"

namespace fs = std::filesystem;
using ax::hub::require_model_dir;

namespace {

// Sets (or unsets, nullopt) an environment variable for the scope of a test.
class EnvVar {
 public:
  EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~EnvVar() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const std::string kCommit = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";

// A hub cache holding `repo` as huggingface_hub lays it out: the files of `model_dir` as blobs, the snapshot of
// kCommit as symlinks into them, refs/main pointing there. Returns the snapshot.
fs::path cache_model(const fs::path& cache, const std::string& repo, const fs::path& model_dir) {
  std::string folder = "models--" + repo;
  folder.replace(folder.find('/'), 1, "--");
  const fs::path root = cache / folder, snap = root / "snapshots" / kCommit;
  fs::create_directories(snap);
  fs::create_directories(root / "blobs");
  fs::create_directories(root / "refs");
  std::ofstream(root / "refs" / "main") << kCommit;  // as huggingface_hub writes it: no newline
  int i = 0;
  for (const auto& e : fs::directory_iterator(model_dir)) {
    const std::string blob = "blob" + std::to_string(i++);
    fs::copy_file(e.path(), root / "blobs" / blob);
    fs::create_symlink("../../blobs/" + blob, snap / e.path().filename());
  }
  return snap;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("hub cache: the cache directory huggingface_hub would use") {
  EnvVar a("HF_HUB_CACHE", std::nullopt), b("HUGGINGFACE_HUB_CACHE", std::nullopt), c("HF_HOME", std::nullopt),
      d("XDG_CACHE_HOME", std::nullopt), home("HOME", "/home/u");
  CHECK(ax::hub::cache_dir().path == "/home/u/.cache/huggingface/hub");
  {
    EnvVar x("XDG_CACHE_HOME", "/x");
    CHECK(ax::hub::cache_dir().path == "/x/huggingface/hub");
    EnvVar h("HF_HOME", "~/hf");
    CHECK(ax::hub::cache_dir().path == "/home/u/hf/hub");
    CHECK(ax::hub::cache_dir().source == "HF_HOME/hub");
    EnvVar l("HUGGINGFACE_HUB_CACHE", "/legacy");
    CHECK(ax::hub::cache_dir().path == "/legacy");
    EnvVar n("HF_HUB_CACHE", "$HOME/hub");
    CHECK(ax::hub::cache_dir().path == "/home/u/hub");
    CHECK(ax::hub::cache_dir().source == "HF_HUB_CACHE");
  }
}

TEST_CASE("hub cache: repo IDs and revisions as huggingface_hub accepts them") {
  auto id = ax::hub::parse_repo_id("Qwen/Qwen3-8B");
  REQUIRE(id);
  CHECK(id->repo == "Qwen/Qwen3-8B");
  CHECK(id->revision == "main");
  id = ax::hub::parse_repo_id("meta-llama/Llama-3.1-8B@refs/pr/12");
  REQUIRE(id);
  CHECK(id->revision == "refs/pr/12");
  for (const char* bad : {"Qwen3-8B", "a/b/c", "/abs/path", "./x/y", "../x", "org/-name", "org/name.", "org--x/y", "o/a..b",
                          "org/name@", "org/name@../x", "org/name@a//b", "org/name@./x", "org /name", ""})
    CHECK_MESSAGE(!ax::hub::parse_repo_id(bad), bad);
}

TEST_CASE("hub cache: an ID resolves to its snapshot, by refs/main, a branch or a commit; a local directory wins") {
  ax_test::TempDir dir;
  ax::test::make_tiny_llama(dir.path / "src");
  const fs::path cache = dir.path / "hub";
  const fs::path snap = cache_model(cache, "org/tiny", dir.path / "src");
  EnvVar env("HF_HUB_CACHE", cache.string());
  CHECK(require_model_dir("org/tiny") == snap.string());
  CHECK(require_model_dir("org/tiny@" + kCommit) == snap.string());
  std::ofstream(cache / "models--org--tiny" / "refs" / "v1") << kCommit << "\n";
  CHECK(require_model_dir("org/tiny@v1") == snap.string());
  CHECK(ax::hub::repo_id_of_snapshot(snap.string()) == "org/tiny");
  std::ofstream(cache / "models--org--tiny" / "refs" / "main") << "0000000000000000000000000000000000000000";
  CHECK(ax::hub::repo_id_of_snapshot(snap.string()) == "org/tiny@" + kCommit);
  CHECK(ax::hub::repo_id_of_snapshot((dir.path / "src").string()).empty());
  // A directory of that name beside the config is what a path names first (transformers' order too).
  fs::create_directories(dir.path / "org" / "tiny");
  CHECK(require_model_dir("org/tiny", dir.path.string()) == (dir.path / "org" / "tiny").string());
  CHECK(ax::hub::find_model_dir("org/tiny", dir.path.string()) == (dir.path / "org" / "tiny").string());
}

TEST_CASE("hub cache: a model that is not there names the directories looked in") {
  ax_test::TempDir dir;
  const fs::path cache = dir.path / "hub";
  fs::create_directories(cache);
  EnvVar env("HF_HUB_CACHE", cache.string());
  std::string err = error_of([&] { require_model_dir("Qwen/Qwen3-8B", dir.path.string()); });
  CHECK(err.find("\"Qwen/Qwen3-8B\" is not a directory (looked for " + (dir.path / "Qwen/Qwen3-8B").string() + ")") != std::string::npos);
  CHECK(err.find("not in the Hugging Face hub cache " + cache.string() + " (HF_HUB_CACHE): looked for " +
                 (cache / "models--Qwen--Qwen3-8B").string()) != std::string::npos);
  CHECK(err.find("hf download Qwen/Qwen3-8B") != std::string::npos);
  // Unresolved, a config keeps the ID as written (the run's check says the above).
  CHECK(ax::hub::find_model_dir("Qwen/Qwen3-8B", dir.path.string()) == "Qwen/Qwen3-8B");
  CHECK(ax::hub::find_model_dir("models/x/y", dir.path.string()) == (dir.path / "models/x/y").string());  // a path, not an ID
  err = error_of([&] { require_model_dir("models/x/y", dir.path.string()); });
  CHECK(err.find((dir.path / "models/x/y").string() + " does not exist") != std::string::npos);
}

TEST_CASE("hub cache: a revision that is not there, and partial snapshots, are named") {
  ax_test::TempDir dir;
  ax::test::make_tiny_llama(dir.path / "src");
  const fs::path cache = dir.path / "hub";
  const fs::path snap = cache_model(cache, "org/tiny", dir.path / "src");
  const fs::path root = cache / "models--org--tiny";
  EnvVar env("HF_HUB_CACHE", cache.string());
  std::string err = error_of([&] { require_model_dir("org/tiny@dev"); });
  CHECK(err.find("org/tiny is in the Hugging Face hub cache") != std::string::npos);
  CHECK(err.find("no revision 'dev' (looked for " + (root / "refs" / "dev").string() + ")") != std::string::npos);
  CHECK(err.find("cached snapshots: " + kCommit) != std::string::npos);

  SUBCASE("a blob gone: the snapshot's symlink dangles") {
    for (const auto& e : fs::directory_iterator(root / "blobs"))
      if (fs::read_symlink(snap / "config.json").filename() == e.path().filename()) fs::remove(e.path());
    err = error_of([&] { require_model_dir("org/tiny"); });
    CHECK(err.find("the snapshot " + snap.string()) != std::string::npos);
    CHECK(err.find("is incomplete: config.json is missing") != std::string::npos);
  }
  SUBCASE("a shard of the index not downloaded yet, its blob .incomplete") {
    fs::rename(snap / "model.safetensors", snap / "model-00001-of-00002.safetensors");
    std::ofstream(root / "blobs" / "f00d.incomplete") << std::string(1000, 'x');
    std::ofstream(snap / "model.safetensors.index.json")
        << R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})";
    err = error_of([&] { require_model_dir("org/tiny"); });
    CHECK(err.find("is incomplete: model-00002-of-00002.safetensors is missing") != std::string::npos);
    CHECK(err.find("downloads that did not finish: blobs/f00d.incomplete (1000 bytes)") != std::string::npos);
    CHECK(ax::hub::find_model_dir("org/tiny", "") == "org/tiny");  // unresolved: the run's check names it
  }
}

TEST_CASE("hub cache cli: validate, run, inspect and generate take a hub ID; the adapter names its base by it") {
  ax_test::TempDir dir;
  ax::test::make_tiny_llama(dir.path / "src");
  const fs::path cache = dir.path / "hub";
  cache_model(cache, "org/tiny", dir.path / "src");
  const std::string env = "HF_HUB_CACHE=" + cache.string() + " AXENGINE_CACHE_DIR=" + (dir / "prepared") + " OMP_NUM_THREADS=1 ";
  auto r = ax_test::run(env + ax_test::axengine() + " make-data --task arithmetic --digits 1 --train 40 --eval 8 --out " + (dir / "data"));
  REQUIRE(r.exit_code == 0);
  const std::string config = "[run]\noutput_dir = \"out\"\n[model]\npath = \"MODEL\"\n[data]\nsequence_len = 64\n"
                             "[[datasets]]\ntype = \"completion\"\npath = \"data/train.jsonl\"\neval_path = \"data/eval.jsonl\"\n"
                             "prompt_field = \"prompt\"\ntext_field = \"answer\"\n[lora]\nr = 4\nalpha = 8\n"
                             "[train]\nmax_steps = 2\nmicro_batch_size = 2\ncpu_threads = 1\n[eval]\nexact_match = false\n";
  auto with_model = [&](const std::string& model) {
    std::string c = config;
    c.replace(c.find("MODEL"), 5, model);
    ax_test::write_file(dir / "run.toml", c);
  };

  with_model("org/absent");
  r = ax_test::run(env + ax_test::axengine() + " validate --config " + (dir / "run.toml"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("model.path: \"org/absent\" is not a directory") != std::string::npos);
  CHECK(r.output.find("not in the Hugging Face hub cache " + cache.string()) != std::string::npos);
  r = ax_test::run(env + ax_test::axengine() + " run --config " + (dir / "run.toml"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("models--org--absent") != std::string::npos);

  with_model("org/tiny");
  r = ax_test::run(env + ax_test::axengine() + " validate --config " + (dir / "run.toml"));
  CHECK(r.exit_code == 0);
  r = ax_test::run(env + ax_test::axengine() + " run --config " + (dir / "run.toml"));
  REQUIRE(r.exit_code == 0);
  bool found = false;
  for (const auto& e : fs::recursive_directory_iterator(dir.path / "out"))
    if (e.path().filename() == "adapter_config.json") {
      auto cfg = nlohmann::json::parse(ax_test::read_file(e.path().string()));
      CHECK(cfg["base_model_name_or_path"] == "org/tiny");
      CHECK(cfg["revision"].is_null());
      found = true;
    }
  CHECK(found);

  r = ax_test::run(env + ax_test::axengine() + " inspect org/tiny");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("llama") != std::string::npos);
  r = ax_test::run(env + ax_test::axengine() + " inspect org/absent@v2");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("looked for " + (cache / "models--org--absent").string()) != std::string::npos);
  ax_test::write_file(dir / "in.jsonl", "{\"prompt\": \"1+1=\"}\n");
  r = ax_test::run(env + ax_test::axengine() + " generate --model org/tiny --max-new-tokens 2 --input " + (dir / "in.jsonl") +
                   " --output " + (dir / "out.jsonl"));
  CHECK(r.exit_code == 0);
}
