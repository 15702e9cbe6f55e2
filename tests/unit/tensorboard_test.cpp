// TensorBoard event files (train/tensorboard.hpp): the bytes equal what protobuf and TensorBoard's own TFRecord
// writer produce, records map to the documented tags, and a (re)started run leaves exactly one event file that
// holds the records it keeps. tests/python/check_tensorboard_events.py reads a real run's file with tensorboard.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "train/tensorboard.hpp"
#include "unit/cli_util.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  return out;
}

}  // namespace

// The goldens: tensorboard 2.21's compat protos and TFRecord checksum (scripts/requirements.txt), e.g.
//   event_pb2.Event(wall_time=1.5, file_version="brain.Event:2").SerializeToString().hex()
TEST_CASE("tensorboard: Event and TFRecord bytes equal protobuf's and TensorBoard's") {
  CHECK(ax::train::masked_crc32c("123456789") == 0xc78ab0e5u);
  CHECK(ax::train::event_file_version(1.5) == unhex("09000000000000f83f1a0d627261696e2e4576656e743a32"));
  // Event(wall_time=1790000000.25, step=300, summary=Summary(value=[Value(tag="train/loss", simple_value=2.25),
  //       Value(tag="eval/loss", simple_value=-0.5)]))
  const std::string event = ax::train::event_scalars(1790000000.25, 300, {{"train/loss", 2.25f}, {"eval/loss", -0.5f}});
  CHECK(event == unhex("09000010e04eacda4110ac022a250a110a0a747261696e2f6c6f737315000010400a100a096576616c2f6c6f737315000000bf"));
  CHECK(ax::train::tfrecord(event) == unhex("33000000000000000ca72056") + event + unhex("ad726218"));
}

TEST_CASE("tensorboard: metrics records map to tags; nulls and unknown keys are left out") {
  auto s = ax::train::record_scalars({{"step", 3}, {"epoch", 0.5}, {"loss", 1.25}, {"lr", 1e-4}, {"grad_norm", 0.75},
                                      {"tokens", 99}, {"tokens_per_s", 1000.0}, {"elapsed_s", 2.0},
                                      {"peak_memory_bytes", 3LL << 29}, {"time", 1.0}});
  std::vector<std::pair<std::string, float>> got;
  for (const auto& v : s) got.emplace_back(v.tag, v.value);
  CHECK(got == std::vector<std::pair<std::string, float>>{{"train/loss", 1.25f}, {"train/learning_rate", 1e-4f},
                                                          {"train/grad_norm", 0.75f}, {"train/epoch", 0.5f},
                                                          {"train/tokens_per_second", 1000.0f},
                                                          {"train/peak_memory_gib", 1.5f}});
  auto e = ax::train::record_scalars({{"step", 4}, {"eval_loss", nullptr}, {"exact_match", 0.25}});
  REQUIRE(e.size() == 1);
  CHECK(e[0].tag == "eval/exact_match");
  CHECK(ax::train::record_scalars({{"step", 4}, {"eval_loss", "nan"}}).empty());
}

TEST_CASE("tensorboard: a started run replaces earlier event files with one holding the kept records") {
  auto dir = ax::test::scratch_dir("tensorboard_log");
  std::ofstream(dir / "events.out.tfevents.1.old.axengine") << "stale";
  std::ofstream(dir / "metrics.jsonl") << "kept\n";
  std::vector<nlohmann::json> kept{{{"step", 1}, {"loss", 2.0}, {"time", 10.0}}, {{"step", 1}, {"eval_loss", nullptr}}};
  {
    ax::train::TensorBoardLog log(dir.string(), kept, /*enabled=*/true);
    auto files = event_files(dir);
    REQUIRE(files.size() == 1);
    CHECK(files[0].string() == log.path());
    nlohmann::json next{{"step", 2}, {"loss", 1.5}, {"time", 11.0}};
    log.append(next);
    log.append({{"step", 2}, {"elapsed_s", 3.0}});  // nothing TensorBoard shows: no event
    const std::string bytes = ax::test::slurp(log.path());
    const std::string head = ax::train::tfrecord(ax::train::event_file_version(0));
    // The first record is the file version (its wall time is now), then one event per record with scalars.
    const std::string rest = ax::train::tfrecord(ax::train::event_scalars(10.0, 1, {{"train/loss", 2.0f}})) +
                             ax::train::tfrecord(ax::train::event_scalars(11.0, 2, {{"train/loss", 1.5f}}));
    REQUIRE(bytes.size() == head.size() + rest.size());
    CHECK(bytes.substr(head.size()) == rest);
  }
  // Disabled: the old file goes (it would disagree with metrics.jsonl), no new one; other files stay.
  ax::train::TensorBoardLog off(dir.string(), kept, /*enabled=*/false);
  CHECK(off.path().empty());
  CHECK(event_files(dir).empty());
  CHECK(fs::is_regular_file(dir / "metrics.jsonl"));
  ax::test::remove_tree(dir);
}
