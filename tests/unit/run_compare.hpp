// Comparing two CLI training runs of the same config: the one that was stopped (a signal, a failed write) and
// resumed with the uninterrupted reference. Bitwise: the final adapter and trainer state bytes, and every
// metrics.jsonl record's numbers except the wall-clock ones (time, elapsed_s, tokens_per_s, peak_memory_bytes,
// data_wait_s), step and eval records alike.
#pragma once
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "unit/cli_util.hpp"

namespace ax::test {

inline std::string step_dir_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return name;
}

// Every whole record of a metrics.jsonl without its wall-clock fields (a torn line fails the parse: REQUIREd).
inline std::vector<nlohmann::json> run_records(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  for (const auto& line : lines_of(metrics)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    const std::string what = metrics.string() + ": not a whole JSON record: " + line;
    REQUIRE_MESSAGE(!j.is_discarded(), what);
    for (const char* k : {"time", "elapsed_s", "tokens_per_s", "peak_memory_bytes", "data_wait_s"}) j.erase(k);
    out.push_back(std::move(j));
  }
  return out;
}

inline void check_same_run(const std::filesystem::path& got, const std::filesystem::path& want, int last_step) {
  const auto a = run_records(got / "metrics.jsonl"), b = run_records(want / "metrics.jsonl");
  CHECK(a.size() == b.size());
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    CAPTURE(i);
    CHECK(a[i].dump() == b[i].dump());  // doubles printed round-trip exact: bitwise
  }
  const auto dir = step_dir_name(last_step);
  for (const char* f : {"adapter_model.safetensors", "trainer_state.safetensors"}) {
    CAPTURE(f);
    const std::string x = slurp(got / "checkpoints" / dir / f);
    CHECK(!x.empty());
    CHECK(x == slurp(want / "checkpoints" / dir / f));
  }
}

// The step-N directories under <out>/checkpoints, by N.
inline std::vector<int> checkpoint_steps(const std::filesystem::path& out) {
  std::vector<int> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out / "checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0) steps.push_back(std::stoi(n.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace ax::test
