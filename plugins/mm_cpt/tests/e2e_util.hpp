// What the plugin's tests share: a fresh scratch directory (with the committed images and a data file), the
// error of a call, the metrics.jsonl readers and the in-process engine.
#pragma once
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "axengine/engine.hpp"
#include "axengine/registry.hpp"
#include "mm_dataset.hpp"

namespace mm_e2e {

// A new directory under the system temp dir, unique to this process and call.
inline std::filesystem::path scratch(const std::string& prefix, const std::string& name) {
  static std::mt19937_64 rng{std::random_device{}()};
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            (prefix + "_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(rng()));
  std::filesystem::create_directories(d);
  return d;
}

// A scratch directory holding the committed test images under img/ and `jsonl` as data.jsonl.
inline std::filesystem::path corpus(const std::string& prefix, const std::string& name, const std::string& jsonl) {
  const std::filesystem::path d = scratch(prefix, name);
  std::filesystem::create_directories(d / "img");
  for (const auto& e : std::filesystem::directory_iterator(std::string(MM_CPT_TEST_DATA) + "/images"))
    std::filesystem::copy_file(e.path(), d / "img" / e.path().filename());
  std::ofstream(d / "data.jsonl") << jsonl;
  return d;
}

// The message of what `f` throws; "" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The JSON objects of a JSON Lines file, blank lines skipped.
inline std::vector<nlohmann::json> lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));
  return out;
}

// The training steps' rows of a run's metrics.jsonl (those with a loss).
inline std::vector<nlohmann::json> steps_of(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  for (auto& j : lines(metrics))
    if (j.contains("loss")) out.push_back(j);
  return out;
}

// One `axengine run`'s engine in this process for dir/configs/mm.toml with the model dir/model: no plugin
// discovery, the mm_cpt type registered by hand (so the test reads this process's decode counter).
inline std::unique_ptr<ax::Engine> start_engine(const std::filesystem::path& dir, std::vector<std::string> sets) {
  ax::StartOptions o;
  o.config_file = (dir / "configs/mm.toml").string();
  sets.push_back("model.path=" + (dir / "model").string());
  o.overrides = sets;
  o.discover = false;
  auto engine = ax::Engine::start(o);
  ax::mm::add_mm_cpt_type(engine->registry);
  return engine;
}

}  // namespace mm_e2e
