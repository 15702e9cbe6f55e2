// What the end-to-end tests (e2e_test.cpp, e2e_stream_test.cpp) share: a fresh scratch directory and the
// metrics.jsonl readers.
#pragma once
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace mm_e2e {

// A new directory under the system temp dir, unique to this process and call.
inline std::filesystem::path scratch(const std::string& prefix, const std::string& name) {
  static std::mt19937_64 rng{std::random_device{}()};
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            (prefix + "_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(rng()));
  std::filesystem::create_directories(d);
  return d;
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

}  // namespace mm_e2e
