// A FIFO (or directory, or device) named like an input file — a model checkpoint, config.json,
// tokenizer.json, a dataset, the run config, a plugin — must be refused with a message naming the path,
// never opened: open(2) of a FIFO blocks until a writer appears, which used to hang inspect, run and
// plugins list forever. Every FIFO here is real (mkfifo). A regression must fail, not hang CTest: in-process
// calls run under a guard that, after 20 s, opens the FIFO's write end so the blocked reader sees end of
// file; command lines run under `timeout`.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/input_file.hpp"
#include "axengine/models.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/registry.hpp"
#include "axengine/safetensors.hpp"
#include "data/jsonl.hpp"
#include "test_util.hpp"
#include "tiny_model.hpp"

using namespace ax_test;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

void make_fifo(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
}

struct Outcome {
  bool blocked = false;  // the call sat in open/read on the FIFO until the guard released it
  std::string error;     // what it threw; "" when it returned normally
};

// Runs `fn` under the guard described at the top of the file.
Outcome guarded(const std::string& fifo, const std::function<void()>& fn) {
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
  Outcome out;
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    out.blocked = true;
    while (result.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
      int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // succeeds only while a reader waits
      if (w >= 0) ::close(w);
    }
  }
  out.error = result.get();
  return out;
}

// The call must be refused at once with "PATH: not a regular file (a FIFO)".
void check_fifo_refused(const std::string& fifo, const std::function<void()>& fn) {
  Outcome o = guarded(fifo, fn);
  INFO("error: " << o.error);
  CHECK_FALSE(o.blocked);
  CHECK(contains(o.error, fifo + ": not a regular file (a FIFO)"));
}

}  // namespace

TEST_CASE("input files: regular files open, FIFOs, directories and devices are refused naming the path") {
  TempDir dir;
  write_file(dir / "ok.json", "{}");
  CHECK(ax::read_regular_file(dir / "ok.json") == "{}");
  CHECK(ax::InputFile(dir / "ok.json").size() == 2);

  make_fifo(dir / "fifo.json");
  check_fifo_refused(dir / "fifo.json", [&] { ax::read_regular_file(dir / "fifo.json"); });
  const std::string dir_msg = dir.path.string() + ": not a regular file (a directory); expected a config file";
  CHECK_THROWS_WITH_AS(ax::read_regular_file(dir.path.string(), "config file"), doctest::Contains(dir_msg.c_str()),
                       ax::UsageError);
  fs::create_symlink("/dev/null", dir / "device.json");
  const std::string device_msg = (dir / "device.json") + ": not a regular file (a character device)";
  CHECK_THROWS_WITH_AS(ax::read_regular_file(dir / "device.json"), doctest::Contains(device_msg.c_str()), ax::UsageError);
  const std::string missing_msg = (dir / "missing.json") + ": cannot open dataset file: No such file or directory";
  CHECK_THROWS_WITH_AS(ax::read_regular_file(dir / "missing.json", "dataset file"), doctest::Contains(missing_msg.c_str()),
                       ax::UsageError);
}

TEST_CASE("input files: a FIFO named like a model file is refused, not opened") {
  TempDir dir;
  ax::test::make_tiny_llama(dir.path);
  const std::string model_dir = dir.path.string();
  SUBCASE("model.safetensors") {
    make_fifo(dir / "model.safetensors");
    check_fifo_refused(dir / "model.safetensors", [&] { ax::safetensors::Checkpoint::open_dir(model_dir); });
  }
  SUBCASE("the shard index and a shard") {
    write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "shard-1.safetensors"}})");
    make_fifo(dir / "shard-1.safetensors");
    check_fifo_refused(dir / "shard-1.safetensors", [&] { ax::safetensors::Checkpoint::open_dir(model_dir); });
    make_fifo(dir / "model.safetensors.index.json");
    check_fifo_refused(dir / "model.safetensors.index.json", [&] { ax::safetensors::Checkpoint::open_dir(model_dir); });
  }
  SUBCASE("config.json") {
    make_fifo(dir / "config.json");
    check_fifo_refused(dir / "config.json", [&] { ax::inspect_model_dir(model_dir); });
  }
  SUBCASE("tokenizer.json and tokenizer_config.json") {
    make_fifo(dir / "tokenizer_config.json");
    check_fifo_refused(dir / "tokenizer_config.json", [&] { ax::load_hf_tokenizer(model_dir); });
    fs::remove(dir / "tokenizer_config.json");  // optional; now only tokenizer.json is at fault
    make_fifo(dir / "tokenizer.json");
    check_fifo_refused(dir / "tokenizer.json", [&] { ax::load_hf_tokenizer(model_dir); });
  }
}

TEST_CASE("input files: a FIFO named as a dataset file or the run config is refused, not opened") {
  TempDir dir;
  make_fifo(dir / "train.jsonl");
  check_fifo_refused(dir / "train.jsonl", [&] {
    ax::data::read_jsonl(dir / "train.jsonl", ax::data::BadRowPolicy::error, [](const nlohmann::json&) { return ""; });
  });
  make_fifo(dir / "run.toml");
  check_fifo_refused(dir / "run.toml", [&] { ax::load_config(dir / "run.toml"); });
  CHECK_THROWS_WITH_AS(ax::load_config(dir / "missing.toml"), doctest::Contains("missing.toml: no such config file"),
                       ax::UsageError);
}

TEST_CASE("input files: a FIFO named x.so in a plugin directory is refused and the other plugins load") {
  TempDir dir;
  make_fifo(dir / "a_fifo.so");
  fs::copy_file(test_plugin("test_ok"), dir / "b_ok.so");
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  check_fifo_refused(dir / "a_fifo.so", [&] {
    loader.discover({dir.path.string()}, "/nonexistent");
    for (const auto& r : loader.reports())
      if (r.status == ax::PluginReport::Status::refused) throw std::runtime_error(r.reason);
  });
  REQUIRE(loader.reports().size() == 2);
  CHECK(loader.reports()[1].status == ax::PluginReport::Status::loaded);
}

TEST_CASE("cli: inspect, validate and plugins list refuse FIFOs with exit codes instead of hanging") {
  TempDir dir;
  ax::test::make_tiny_llama(dir.path / "model");
  make_fifo(dir / "model/model.safetensors");
  auto r = run("timeout 120 " + axengine() + " inspect " + (dir / "model"));
  INFO(r.output);
  CHECK(r.exit_code == 2);  // timeout's 124 when it blocks
  CHECK(contains(r.output, (dir / "model/model.safetensors") + ": not a regular file (a FIFO)"));

  make_fifo(dir / "model/config.json");
  r = run("timeout 120 " + axengine() + " inspect " + (dir / "model"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, (dir / "model/config.json") + ": not a regular file (a FIFO)"));

  make_fifo(dir / "run.toml");
  r = run("timeout 120 " + axengine() + " validate --config " + (dir / "run.toml"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, (dir / "run.toml") + ": not a regular file (a FIFO); expected a run config"));

  fs::create_directories(dir.path / "plugins");
  make_fifo(dir / "plugins/x.so");
  fs::copy_file(test_plugin("test_ok"), dir / "plugins/y.so");
  r = run("AXENGINE_PLUGIN_PATH=" + (dir / "plugins") + " timeout 120 " + axengine() + " plugins list");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, (dir / "plugins/x.so") + ": not a regular file (a FIFO)"));
  CHECK(contains(r.output, "[loaded] test_ok 1.2.3  " + (dir / "plugins/y.so")));
}
