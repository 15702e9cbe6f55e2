// Streamed steps made on a background thread (train/stream_prefetch.hpp, data.prefetch_steps): the steps, their
// rows and the cursors are those of depth 0; the worker is never more than `depth` steps ahead and makes no
// step past the run's; an exception thrown making a step reaches the consumer, as itself, at that step; the
// worker is joined when the consumer stops early or fails. The trainer-level checks (same losses and read
// order at depth 0 and 2, resume, a bad row named at its step) are here and in stream_test.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "train/stream_prefetch.hpp"
#include "unit/stream_fixture.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;
using ax::test::Harness;
using ax::test::write_text;
using ax::train::StreamedStep;
using ax::train::StreamPrefetcher;

namespace {

// stream_fixture.hpp's streamed run; `extra` goes into [[datasets]].
fs::path make_dir(const std::string& name, const std::string& extra = "") {
  return ax::test::make_stream_dir(name, "streaming = true\n" + extra, "");
}

// A step that only says which it is (its pass), for the mechanism's own checks.
StreamedStep numbered(uint64_t n) {
  StreamedStep s;
  s.pass = n;
  return s;
}

struct Boom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

TEST_CASE("stream prefetch: depth 0 and depth 2 give the same steps, rows and cursors over two passes") {
  auto dir = make_dir("prefetch_same");
  Harness a(dir), b(dir);
  auto& fa = *a.setup.data.stream;
  auto& fb = *b.setup.data.stream;
  const int64_t steps = 12;  // 12 x 2 x 2 rows: past the first pass (about 10 rows)
  StreamPrefetcher p0([&] { return ax::train::read_streamed_step(fa, 2, 2, 1, 0, 24); }, steps, 0);
  StreamPrefetcher p2([&] { return ax::train::read_streamed_step(fb, 2, 2, 1, 0, 24); }, steps, 2);
  bool second_pass = false;
  for (int64_t s = 0; s < steps; ++s) {
    CAPTURE(s);
    StreamedStep x = p0.next(), y = p2.next();
    CHECK(x.tokens == y.tokens);
    CHECK(x.trainable == y.trainable);
    CHECK(x.pass == y.pass);
    CHECK(x.next.to_json() == y.next.to_json());
    second_pass |= x.pass == 1;
    REQUIRE(x.samples.size() == y.samples.size());
    for (std::size_t j = 0; j < x.samples.size(); ++j) {
      CHECK(x.rows[j].rows == y.rows[j].rows);
      REQUIRE(x.samples[j].size() == y.samples[j].size());
      for (std::size_t k = 0; k < x.samples[j].size(); ++k) {
        CHECK(x.samples[j][k].input_ids == y.samples[j][k].input_ids);
        CHECK(x.samples[j][k].labels == y.samples[j][k].labels);
      }
    }
  }
  CHECK(second_pass);
  // Depth 0 reads nothing ahead: its feed is where the last step left it. Depth 2 made exactly `steps` steps
  // (no more), so its feed is there too.
  CHECK(fa.cursor().to_json() == fb.cursor().to_json());
}

TEST_CASE("stream prefetch: at most `depth` steps ahead, none past the last, in order") {
  for (int64_t depth : {1, 2, 3}) {
    CAPTURE(depth);
    std::atomic<int64_t> made{0};
    {
      StreamPrefetcher p([&] { return numbered(static_cast<uint64_t>(made++)); }, 7, depth);
      for (int64_t taken = 0; taken < 7; ++taken) {
        CAPTURE(taken);
        // A slow consumer: the worker fills up to `depth` steps ahead (or the run's end), then waits for room.
        const int64_t want = std::min<int64_t>(depth, 7 - taken);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (made.load() - taken < want && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // time to overrun, were it able to
        CHECK(made.load() - taken == want);
        CHECK(p.next().pass == static_cast<uint64_t>(taken));
      }
      CHECK_THROWS_AS(p.next(), ax::RuntimeError);  // past the run's steps
    }
    CHECK(made == 7);
  }
}

TEST_CASE("stream prefetch: an exception making step k reaches next() at step k, as itself; the worker is joined") {
  for (int64_t depth : {0, 2}) {
    CAPTURE(depth);
    std::atomic<int> made{0};
    StreamPrefetcher p(
        [&] {
          const int n = made++;
          if (n == 3) throw Boom("shard-7.jsonl:12: the row's image is missing");
          return numbered(static_cast<uint64_t>(n));
        },
        10, depth);
    for (uint64_t s = 0; s < 3; ++s) CHECK(p.next().pass == s);  // the steps before it, undisturbed
    try {
      p.next();
      FAIL("no exception");
    } catch (const Boom& e) {
      CHECK(std::string(e.what()) == "shard-7.jsonl:12: the row's image is missing");
    }
    CHECK(made == 4);  // nothing after the failed step was attempted
  }
}

TEST_CASE("stream prefetch: a consumer that stops early (max_steps, an error elsewhere) leaves no thread behind") {
  std::atomic<int> made{0};
  auto t0 = std::chrono::steady_clock::now();
  {
    StreamPrefetcher p([&] { return numbered(static_cast<uint64_t>(made++)); }, 1000, 2);
    CHECK(p.next().pass == 0);
  }  // destroyed with steps ready and the worker waiting for room: it must wake and exit
  CHECK(made <= 3);
  {
    // Destroyed while the worker is inside produce(): joined after that step.
    std::atomic<bool> inside{false};
    StreamPrefetcher p(
        [&] {
          inside = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return numbered(0);
        },
        5, 2);
    while (!inside) std::this_thread::yield();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("stream prefetch: training at depth 0 and depth 2 gives bitwise the same losses, tokens and checkpoints") {
  auto dir = make_dir("prefetch_train");
  Harness d0(dir, {"data.prefetch_steps=0", "run.output_dir=\"out0\""});
  auto s0 = d0.run();
  Harness d2(dir, {"data.prefetch_steps=2", "run.output_dir=\"out2\""});
  auto s2 = d2.run();
  REQUIRE(s0.losses.size() == 8);
  CHECK(s0.losses == s2.losses);  // exact
  CHECK(s0.tokens == s2.tokens);
  for (const char* step : {"step-00000004", "step-00000008"}) {
    CAPTURE(step);
    auto state = [&](const char* out) {
      return nlohmann::json::parse(std::ifstream(dir / out / "checkpoints" / step / "trainer_state.json"))["data_stream"];
    };
    CHECK(state("out0") == state("out2"));
  }
  // The host's wait for each step's rows is recorded; at depth 0 it is the reading itself (never nothing).
  for (const char* out : {"out0", "out2"}) {
    CAPTURE(out);
    std::ifstream m(dir / out / "metrics.jsonl");
    int with_wait = 0;
    double total = 0;
    for (std::string l; std::getline(m, l);)
      if (auto j = nlohmann::json::parse(l); j.contains("loss") && j.contains("data_wait_s")) {
        with_wait += j["data_wait_s"].get<double>() >= 0;
        total += j["data_wait_s"].get<double>();
      }
    CHECK(with_wait == 8);
    if (std::string(out) == "out0") CHECK(total > 0);
  }
}

TEST_CASE("stream prefetch: a bad row stops the run at its step with the message of depth 0, after the steps before it") {
  auto dir = make_dir("prefetch_bad");
  // Row 2 of the second shard lacks its text: about the fifth packed row, step 3 at 2 rows a step.
  write_text(dir / "sums-1.jsonl", "{\"prompt\": \"1+1=\", \"text\": \"2\"}\n{\"prompt\": \"1+2=\"}\n");
  std::string msg[2];
  std::size_t trained[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string out = "out" + std::to_string(i);
    Harness h(dir, {ax::str("data.prefetch_steps=", i * 2), "train.micro_batch_size=2", "run.output_dir=\"" + out + "\""});
    try {
      h.run();
      FAIL("the run did not stop");
    } catch (const ax::UsageError& e) {
      msg[i] = e.what();
    }
    std::ifstream m(dir / out / "metrics.jsonl");
    for (std::string l; std::getline(m, l);) trained[i] += nlohmann::json::parse(l).contains("loss");
  }
  CHECK(msg[0].find("sums-1.jsonl:2: field 'text' is missing") != std::string::npos);
  CHECK(msg[1] == msg[0]);
  CHECK(trained[0] >= 1);
  CHECK(trained[1] == trained[0]);  // the error came when its step was reached, not when the worker read it
}

TEST_CASE("stream prefetch: data.prefetch_steps is refused for map-style data and bounded") {
  auto dir = make_dir("prefetch_config");
  auto err = [&](std::vector<std::string> sets) {
    try {
      Harness h(dir, std::move(sets));
    } catch (const ax::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no UsageError)");
  };
  CHECK(err({"data.prefetch_steps=17"}).find("prefetch_steps") != std::string::npos);
  CHECK(err({"data.prefetch_steps=-1"}).find("prefetch_steps") != std::string::npos);
  // Map-style: the same entry without streaming = true.
  std::ifstream in(dir / "run.toml");
  std::string t((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  t.replace(t.find("streaming = true\n"), 17, "");
  t.replace(t.find("max_steps = 8"), 13, "num_epochs = 1");
  write_text(dir / "run.toml", t);
  CHECK(err({}) == "(no UsageError)");  // the default is no error
  CHECK(err({"data.prefetch_steps=2"}).find("data.prefetch_steps applies to a streamed dataset") != std::string::npos);
}
