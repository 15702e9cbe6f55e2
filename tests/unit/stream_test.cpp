// Streaming datasets (axengine/stream.hpp, data/stream_feed.hpp, docs/datasets.md "Streaming"): the stream
// gives the map-style samples in file order and packs them as pack_samples does in that order; a resumed run
// continues at the next row without reading earlier ones and ends as the uninterrupted run does; the config
// checks stop with file:line:col; missing shards and bad rows are named.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <sstream>

#include "axengine/error.hpp"
#include "axengine/stream.hpp"
#include "data/packing.hpp"
#include "data/types.hpp"
#include "train/stream_step.hpp"
#include "unit/stream_fixture.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;
using ax::test::Harness;
using ax::test::make_stream_dir;
using ax::test::write_text;

namespace {

// Replaces `from` by `to` in the dir's run.toml (--set cannot reach into [[datasets]]).
void edit(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "run.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  REQUIRE(t.find(from) != std::string::npos);
  write_text(dir / "run.toml", t.replace(t.find(from), from.size(), to));
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

// A `completion`-like streaming type that records the text of every row it converts: what a run read.
std::mutex g_read_mutex;
std::vector<std::string> g_read;

class RecordingType final : public ax::DatasetType, public ax::StreamingDatasetType {
 public:
  explicit RecordingType(std::shared_ptr<ax::DatasetType> completion) : completion_(std::move(completion)) {}
  std::vector<std::string> known_keys() const override { return completion_->known_keys(); }
  std::shared_ptr<ax::Dataset> open(const toml::table& e, const ax::DatasetContext& c) const override { return completion_->open(e, c); }
  std::unique_ptr<ax::SampleStream> open_stream(const toml::table& entry, const ax::DatasetContext& ctx) const override {
    const std::string path = ax::data::resolve_against(ctx.base_dir, entry["path"].value_or(std::string()));
    const ax::Tokenizer* tok = ctx.tokenizer;
    return ax::make_jsonl_stream(ax::stream_shards(path), false, [tok](const nlohmann::json& row, const std::string&) {
      std::lock_guard<std::mutex> lock(g_read_mutex);
      g_read.push_back(row["prompt"].get<std::string>());
      ax::Sample s;
      for (unsigned char c : row["prompt"].get<std::string>() + row["text"].get<std::string>()) s.input_ids.push_back(c);
      s.input_ids.push_back(tok->eos_id());
      s.labels = s.input_ids;
      s.labels[0] = -100;
      return s;
    });
  }

 private:
  std::shared_ptr<ax::DatasetType> completion_;
};

void add_recording(ax::Registry& reg) {
  ax::Provider p;
  p.info.kind = ax::ProviderKind::dataset;
  p.info.name = "recording";
  p.object = std::make_shared<RecordingType>(ax::data::make_completion_type());
  reg.add(std::move(p));
}

}  // namespace

TEST_CASE("streaming: the stream gives the map-style samples in file order, packed as pack_samples packs that order") {
  auto dir = make_stream_dir("stream_order", "streaming = true\n", "");
  Harness streamed(dir);
  REQUIRE(streamed.setup.data.stream);
  CHECK(streamed.setup.data.train.empty());
  auto map_dir = make_stream_dir("stream_order_map", "", "");
  Harness mapped(map_dir);
  REQUIRE(!mapped.setup.data.stream);
  const auto& want = mapped.setup.data.train;
  REQUIRE(want.size() == 30);
  std::vector<uint32_t> order(want.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto packed = ax::data::pack_samples(want, order, 24);
  // Two passes: the second starts again at the first shard's first row.
  auto& feed = *streamed.setup.data.stream;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& row : packed.rows) {
      CHECK(feed.cursor().pass == static_cast<uint64_t>(pass));
      auto got = feed.next_row();
      REQUIRE(got.size() == row.size());
      for (std::size_t k = 0; k < row.size(); ++k) {
        CHECK(got[k].input_ids == want[row[k]].input_ids);
        CHECK(got[k].labels == want[row[k]].labels);
      }
    }
}

TEST_CASE("streaming: a resumed run reads no row before its cursor and ends as the uninterrupted run") {
  // Without and with steps read ahead on a background thread (data.prefetch_steps, stream_prefetch.hpp): the
  // checkpoint's cursor is that of the rows trained on, never of those read ahead.
  std::vector<double> losses_at_depth0;
  for (int depth : {0, 2}) {
    CAPTURE(depth);
    const std::string prefetch = "data.prefetch_steps=" + std::to_string(depth);
    auto full_dir = make_stream_dir("stream_full", "streaming = true\n", "");
    edit(full_dir, "type = \"completion\"", "type = \"recording\"");
    g_read.clear();
    Harness full(full_dir, {prefetch}, add_recording);
    auto full_sum = full.run();
    const std::vector<std::string> full_read = g_read;
    REQUIRE(full_sum.losses.size() == 8);
    if (depth == 0) losses_at_depth0 = full_sum.losses;
    CHECK(full_sum.losses == losses_at_depth0);  // bitwise

    auto dir = ax::test::scratch_dir("stream_resumed");
    fs::copy(full_dir / "run.toml", dir / "run.toml");
    for (int s = 0; s < 3; ++s) fs::copy(full_dir / ("sums-" + std::to_string(s) + ".jsonl"), dir / ("sums-" + std::to_string(s) + ".jsonl"));
    g_read.clear();
    {
      Harness first(dir, {"train.max_steps=4", prefetch}, add_recording);
      first.run();
    }
    const std::vector<std::string> first_read = g_read;
    g_read.clear();
    Harness second(dir, {"checkpoint.resume_from=\"latest\"", prefetch}, add_recording);
    auto sum = second.run();
    const std::vector<std::string> second_read = g_read;
    // The first run read its rows and one more (the packer's lookahead, not trained on); the resumed run starts
    // at that row: no row of the first four steps is read again.
    REQUIRE(!first_read.empty());
    std::vector<std::string> joined(first_read.begin(), first_read.end() - 1);
    joined.insert(joined.end(), second_read.begin(), second_read.end());
    CHECK(joined == full_read);
    CHECK(second_read.size() + first_read.size() - 1 == full_read.size());
    REQUIRE(sum.losses.size() == 4);
    for (int i = 0; i < 4; ++i) CHECK(sum.losses[i] == full_sum.losses[4 + i]);
    // The cursor is in trainer_state.json; the uninterrupted run saved the same one at step 4, though with
    // prefetch its feed was further on then.
    auto state = [](const fs::path& d) {
      return nlohmann::json::parse(std::ifstream(d / "out/checkpoints/step-00000004/trainer_state.json"));
    };
    auto j = state(dir);
    REQUIRE(j.contains("data_stream"));
    CHECK(j["data_stream"]["cursor"]["file"].get<std::string>().find("sums-") != std::string::npos);
    CHECK(j["data_stream"]["sequence_len"] == 24);
    auto full_state = state(full_dir)["data_stream"], resumed_state = j["data_stream"];
    for (auto* st : {&full_state, &resumed_state})  // the same shard, in the two runs' own dirs
      (*st)["cursor"]["file"] = fs::path((*st)["cursor"]["file"].get<std::string>()).filename().string();
    CHECK(full_state == resumed_state);
  }
}

TEST_CASE("streaming: config errors name file:line:col") {
  auto dir = make_stream_dir("stream_config", "streaming = true\n", "");
  // max_steps missing: the error points at `streaming = true` (line 11 of run.toml).
  auto no_steps = usage_error([&] { Harness h(dir, {"train.max_steps=0"}); });
  CHECK(no_steps.find("run.toml:11:13: streaming = true needs train.max_steps > 0") != std::string::npos);
  auto epochs = usage_error([&] { Harness h(dir, {"train.num_epochs=2"}); });
  CHECK(epochs.find("train.num_epochs does not apply to a streamed dataset") != std::string::npos);
  auto fraction = usage_error([&] { Harness h(dir, {"data.eval_fraction=0.1"}); });
  CHECK(fraction.find("run.toml:11:13: eval_fraction cannot hold rows out of a stream") != std::string::npos);
  edit(dir, "type = \"completion\"\npath = \"sums-*.jsonl\"\nprompt_field = \"prompt\"", "type = \"alpaca\"\npath = \"sums-*.jsonl\"");
  auto alpaca = usage_error([&] { Harness h(dir); });
  CHECK(alpaca.find("run.toml:10:13: dataset type \"alpaca\" cannot stream") != std::string::npos);
}

TEST_CASE("streaming: missing shards, a vanished shard, a JSON array and a changed shard list are named") {
  auto dir = make_stream_dir("stream_files", "streaming = true\n", "");
  edit(dir, "sums-*.jsonl", "nope-*.jsonl");
  CHECK(usage_error([&] { Harness h(dir); }).find("nope-*.jsonl: the glob matches no data file") != std::string::npos);
  write_text(dir / "arr.jsonl", "[{\"prompt\": \"1+1=\", \"text\": \"2\"}]");
  edit(dir, "nope-*.jsonl", "arr.jsonl");
  CHECK(usage_error([&] { Harness h(dir); }).find("arr.jsonl: a JSON array; streaming reads JSON Lines") != std::string::npos);
  write_text(dir / "arr.jsonl", "\xEF\xBB\xBF [{\"prompt\": \"1+1=\", \"text\": \"2\"}]");  // after a byte order mark too
  CHECK(usage_error([&] { Harness h(dir); }).find("arr.jsonl: a JSON array; streaming reads JSON Lines") != std::string::npos);
  edit(dir, "arr.jsonl", "sums-*.jsonl");
  {
    Harness h(dir);
    fs::remove(dir / "sums-2.jsonl");  // vanishes after the stream opened: named when the stream gets there
    auto& feed = *h.setup.data.stream;
    std::string err = usage_error([&] { for (int i = 0; i < 40; ++i) feed.next_row(); });
    CHECK(err.find("sums-2.jsonl: cannot open the data shard") != std::string::npos);
  }
  Harness h(dir);  // two shards now
  ax::StreamCursor c;
  c.shard = 2, c.file = (dir / "sums-2.jsonl").string();
  CHECK(usage_error([&] { h.setup.data.stream->seek(c); }).find("the shards changed since the checkpoint") != std::string::npos);
}

TEST_CASE("streaming: bad rows follow on_bad_row") {
  auto dir = make_stream_dir("stream_bad", "streaming = true\n", "");
  write_text(dir / "sums-1.jsonl", "{\"prompt\": \"1+1=\", \"text\": \"2\"}\n{\"prompt\": \"1+2=\"}\nnot json\n{\"prompt\": \"2+2=\", \"text\": \"4\"}\n");
  {
    Harness h(dir);
    std::string err = usage_error([&] { for (int i = 0; i < 40; ++i) h.setup.data.stream->next_row(); });
    CHECK(err.find("sums-1.jsonl:2: field 'text' is missing") != std::string::npos);
  }
  edit(dir, "streaming = true\n", "streaming = true\non_bad_row = \"skip\"\n");
  Harness h(dir);
  std::size_t samples = 0;
  while (h.setup.data.stream->cursor().pass == 0) samples += h.setup.data.stream->next_row().size();
  CHECK(h.setup.data.stream->stream().skipped_rows() == 2);
  CHECK(samples == 22);  // 10 + 2 + 10 usable rows in the first pass
}

TEST_CASE("streaming: data-parallel ranks train disjoint rows of the same stream and agree on the step's tokens") {
  auto dir = make_stream_dir("stream_ranks", "streaming = true\n", "");
  Harness one(dir), r0(dir), r1(dir);
  for (int step = 0; step < 3; ++step) {
    auto all = ax::train::read_streamed_step(*one.setup.data.stream, 1, 4, 1, 0, 24);
    auto a = ax::train::read_streamed_step(*r0.setup.data.stream, 1, 2, 2, 0, 24);
    auto b = ax::train::read_streamed_step(*r1.setup.data.stream, 1, 2, 2, 1, 24);
    CHECK(a.tokens == all.tokens);
    CHECK(b.tokens == all.tokens);
    CHECK(a.trainable == all.trainable);
    // Rank k's micro-batch j is row j * world + k of the step.
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) {
        const auto& mine = (k == 0 ? a : b).samples[static_cast<std::size_t>(j)];
        const auto& want = all.samples[static_cast<std::size_t>(j * 2 + k)];
        REQUIRE(mine.size() == want.size());
        for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i].input_ids == want[i].input_ids);
      }
    CHECK(r0.setup.data.stream->cursor().to_json() == r1.setup.data.stream->cursor().to_json());
  }
}
