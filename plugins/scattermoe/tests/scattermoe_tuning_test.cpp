// The scattermoe tuning cache and tile heuristic (plain C++, no GPU): key bucketing, JSON round trip,
// corrupt / unknown entries, atomic writes (also killed at each crash point), precedence of the user file over
// shipped files, and the heuristic's choices on the benchmark shapes.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

// The cache and the heuristic are plain C++ compiled into the plugin; the plugin itself needs nvcc, so the
// test executable compiles these two sources itself (plugins/scattermoe/tests/CMakeLists.txt) and runs on every build.
#include "axengine/crash_point.hpp"
#include "tile_heuristic.hpp"
#include "tuning_cache.hpp"
#include "test_util.hpp"

namespace sm = ax::scattermoe;
namespace fs = std::filesystem;

namespace {
std::string key(sm::GemmOp op, int64_t E, int64_t M, int64_t N, int64_t K, int64_t r) {
  return sm::TuningKey{"NVIDIA H200 sm_90", op, E, M, N, K, r}.str();
}

sm::TileQuery query(sm::GemmOp op, int64_t E, int64_t M, int64_t N, int64_t K, int occ = 2) {
  sm::TileQuery q;
  q.op = op;
  q.variant.family = op == sm::GemmOp::gram ? sm::TileFamily::gram : sm::TileFamily::grouped;
  q.E = E;
  q.M = M;
  q.N = N;
  q.K = K;
  q.sms = 132;
  for (int t = 0; t < sm::kTileCount; ++t) q.occupancy[t] = occ;
  return q;
}
}  // namespace

TEST_CASE("scattermoe tuning: rows are bucketed to powers of two, the rest of the key is exact") {
  CHECK(sm::bucket_rows(0) == 0);
  CHECK(sm::bucket_rows(1) == 1);
  CHECK(sm::bucket_rows(3) == 4);
  CHECK(sm::bucket_rows(32768) == 32768);
  CHECK(sm::bucket_rows(32769) == 65536);
  // Token counts of one bucket share an entry; other sizes do not.
  CHECK(key(sm::GemmOp::forward, 128, 20000, 1536, 2048, 16) == key(sm::GemmOp::forward, 128, 32768, 1536, 2048, 16));
  CHECK(key(sm::GemmOp::forward, 128, 40000, 1536, 2048, 16) != key(sm::GemmOp::forward, 128, 32768, 1536, 2048, 16));
  CHECK(key(sm::GemmOp::forward, 128, 32768, 1536, 2048, 16) != key(sm::GemmOp::dx, 128, 32768, 1536, 2048, 16));
  CHECK(key(sm::GemmOp::forward, 128, 32768, 1536, 2048, 16) ==
        "NVIDIA H200 sm_90|forward|E=128|M=32768|N=1536|K=2048|r=16");

  auto k = sm::parse_key("NVIDIA H200 sm_90|gram|E=8|M=8192|N=4096|K=16|r=16");
  REQUIRE(k.has_value());
  CHECK(k->op == sm::GemmOp::gram);
  CHECK(k->E == 8);
  CHECK(k->N == 4096);
  CHECK(k->str() == "NVIDIA H200 sm_90|gram|E=8|M=8192|N=4096|K=16|r=16");
  CHECK_FALSE(sm::parse_key("NVIDIA H200 sm_90|gram|E=8|M=8000|N=4096|K=16|r=16"));  // M not a bucket
  CHECK_FALSE(sm::parse_key("NVIDIA H200 sm_90|warp|E=8|M=8192|N=4096|K=16|r=16"));  // unknown op
  CHECK_FALSE(sm::parse_key("NVIDIA H200 sm_90|gram|E=8|M=8192|N=4096|K=16"));       // missing field
  CHECK_FALSE(sm::parse_key("NVIDIA H200 sm_90|gram|E=x|M=8192|N=4096|K=16|r=16"));  // not a number
  CHECK_FALSE(sm::parse_key("|gram|E=8|M=8192|N=4096|K=16|r=16"));                    // no GPU
}

TEST_CASE("scattermoe tuning: the cache round-trips through its JSON file") {
  ax_test::TempDir dir;
  const fs::path file = dir.path / "sub" / "cache.json";  // the directory is created on save
  const std::string k1 = key(sm::GemmOp::forward, 128, 32768, 1536, 2048, 16);
  const std::string k2 = key(sm::GemmOp::gram, 8, 8192, 4096, 16, 16);
  {
    sm::TuningCache c;
    c.load_user(file);  // missing: empty, no warning
    CHECK(c.size() == 0);
    CHECK(c.warnings().empty());
    c.store(k1, "64x128");
    c.store(k2, "gram128x32");
    REQUIRE(c.save());
  }
  sm::TuningCache c;
  c.load_user(file);
  CHECK(c.warnings().empty());
  CHECK(c.lookup(k1) == std::optional<std::string>("64x128"));
  CHECK(c.lookup(k2) == std::optional<std::string>("gram128x32"));
  CHECK_FALSE(c.lookup(key(sm::GemmOp::dx, 128, 32768, 1536, 2048, 16)));
  // No temporary file is left behind.
  int n = 0;
  for (const auto& e : fs::directory_iterator(file.parent_path())) n += e.path().filename() != "cache.json";
  CHECK(n == 0);
}

TEST_CASE("scattermoe tuning: a save merges with entries another process wrote meanwhile") {
  ax_test::TempDir dir;
  const fs::path file = dir.path / "cache.json";
  const std::string mine = key(sm::GemmOp::forward, 64, 32768, 2048, 2048, 16);
  const std::string theirs = key(sm::GemmOp::dx, 64, 32768, 2048, 2048, 16);
  sm::TuningCache a;
  a.load_user(file);
  sm::TuningCache::write_file(file, {{theirs, "128x64"}, {mine, "64x64"}});  // the other process
  a.store(mine, "128x128");
  REQUIRE(a.save());
  std::string w;
  auto entries = sm::TuningCache::read_file(file, w);
  CHECK(w.empty());
  CHECK(entries.size() == 2);
  CHECK(entries[theirs] == "128x64");
  CHECK(entries[mine] == "128x128");  // ours wins on a conflict
}

TEST_CASE("scattermoe tuning: corrupt files and unknown entries warn once and are ignored") {
  ax_test::TempDir dir;
  const std::string good = key(sm::GemmOp::forward, 8, 8192, 28672, 4096, 16);
  SUBCASE("not JSON") {
    ax_test::write_file(dir / "c.json", "{\"version\": 1, \"entries\": {\"a\": ");
    sm::TuningCache c;
    c.load_user(dir.path / "c.json");
    CHECK(c.size() == 0);
    REQUIRE(c.warnings().size() == 1);
    CHECK(c.warnings()[0].find("c.json") != std::string::npos);
    CHECK(c.warnings()[0].find("not valid JSON") != std::string::npos);
  }
  SUBCASE("wrong version or shape") {
    ax_test::write_file(dir / "c.json", "{\"version\": 7, \"entries\": {}}");
    sm::TuningCache c;
    c.load_user(dir.path / "c.json");
    CHECK(c.size() == 0);
    CHECK(c.warnings().size() == 1);
    ax_test::write_file(dir / "d.json", "[1, 2, 3]");
    c.load_user(dir.path / "d.json");
    REQUIRE(c.warnings().size() == 2);
    CHECK(c.warnings()[1].find("not a JSON object") != std::string::npos);
  }
  SUBCASE("unknown tiles, wrong family, bad keys, non-string values: one warning, good entries kept") {
    const std::string text = std::string("{\"version\": 1, \"entries\": {") +  //
                             "\"" + good + "\": \"128x64\"," +                 // valid
                             "\"" + key(sm::GemmOp::dx, 8, 8192, 4096, 14336, 16) + "\": \"256x256\"," +
                             "\"" + key(sm::GemmOp::gram, 8, 8192, 4096, 16, 16) + "\": \"128x64\"," +
                             "\"" + key(sm::GemmOp::forward, 8, 8192, 4096, 14336, 16) + "\": \"gram128x16\"," +
                             "\"garbage key\": \"128x128\"," +  //
                             "\"" + key(sm::GemmOp::thin, 8, 8192, 16, 4096, 16) + "\": 5}}";
    ax_test::write_file(dir / "c.json", text);
    sm::TuningCache c;
    c.load_user(dir.path / "c.json");
    CHECK(c.size() == 1);
    CHECK(c.lookup(good) == std::optional<std::string>("128x64"));
    REQUIRE(c.warnings().size() == 1);
    CHECK(c.warnings()[0].find("ignored 5 unknown or invalid entries") != std::string::npos);
  }
  SUBCASE("a directory of shipped files with one corrupt file") {
    const fs::path shipped = dir.path / "scattermoe_tuning";
    sm::TuningCache::write_file(shipped / "nvidia-h200.json", {{good, "64x128"}});
    ax_test::write_file((shipped / "broken.json").string(), "not json at all");
    ax_test::write_file((shipped / "README.txt").string(), "ignored: not .json");
    sm::TuningCache c;
    c.load_shipped_dir(shipped);
    c.load_shipped_dir(dir.path / "missing");  // fine: no entries, no warning
    CHECK(c.lookup(good) == std::optional<std::string>("64x128"));
    CHECK(c.warnings().size() == 1);
  }
}

TEST_CASE("scattermoe tuning: the user file wins over shipped files, and tuning runs ignore shipped entries") {
  ax_test::TempDir dir;
  const std::string k = key(sm::GemmOp::forward, 8, 8192, 28672, 4096, 16);
  const std::string only_shipped = key(sm::GemmOp::dx, 8, 8192, 4096, 28672, 16);
  sm::TuningCache::write_file(dir.path / "shipped" / "gpu.json", {{k, "128x64"}, {only_shipped, "64x128"}});
  sm::TuningCache::write_file(dir.path / "user.json", {{k, "64x64"}});
  sm::TuningCache c;
  c.load_shipped_dir(dir.path / "shipped");
  c.load_user(dir.path / "user.json");
  CHECK(c.lookup(k) == std::optional<std::string>("64x64"));
  CHECK(c.lookup(only_shipped) == std::optional<std::string>("64x128"));
  CHECK_FALSE(c.lookup(only_shipped, /*shipped=*/false));
  CHECK(c.size() == 2);
}

TEST_CASE("scattermoe tuning: atomic write replaces the file whole and fails cleanly") {
  ax_test::TempDir dir;
  const fs::path file = dir.path / "cache.json";
  sm::TuningCache::write_file(file, {{key(sm::GemmOp::thin, 8, 8192, 16, 4096, 16), "128x16"}});
  sm::TuningCache::write_file(file, {{key(sm::GemmOp::thin, 8, 8192, 16, 4096, 16), "128x32"}});
  std::string w;
  auto e = sm::TuningCache::read_file(file, w);
  CHECK(w.empty());
  REQUIRE(e.size() == 1);
  CHECK(e.begin()->second == "128x32");
  // A target whose directory cannot be created (a file is in the way): an exception, no stray file,
  // and save() turns it into a warning.
  ax_test::write_file(dir / "blocker", "x");
  CHECK_THROWS(sm::TuningCache::write_file(dir.path / "blocker" / "cache.json", {}));
  sm::TuningCache c;
  c.load_user(dir.path / "blocker" / "cache.json");
  c.store(key(sm::GemmOp::thin, 8, 8192, 16, 4096, 16), "128x16");
  CHECK_FALSE(c.save());
  CHECK(c.warnings().size() == 1);
}

TEST_CASE("scattermoe tuning: a save killed at any crash point leaves the old file or the new one, whole") {
  ax_test::TempDir dir;
  const fs::path file = dir.path / "cache.json";
  const std::string k1 = key(sm::GemmOp::thin, 8, 8192, 16, 4096, 16), k2 = key(sm::GemmOp::dx, 64, 32768, 2048, 2048, 16);
  auto write_old = [&] { sm::TuningCache::write_file(file, {{k1, "128x16"}}); };
  auto save_new = [&] {
    sm::TuningCache c;
    c.load_user(file);
    c.store(k2, "64x64");
    if (!c.save()) throw std::runtime_error("save failed");
  };
  // The save in a forked child with the hooks armed (the env is read once, at load): its wait status.
  auto in_child = [&](const std::string& crash_at, const std::string& trace) {
    pid_t pid = ::fork();
    if (pid == 0) {
      try {
        ax::set_crash_points_for_test(crash_at, trace);
        save_new();
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  };
  write_old();
  const std::string old_bytes = ax_test::read_file(file.string());
  const std::string trace = (dir.path / "trace").string();
  int status = in_child("", trace);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  const std::string new_bytes = ax_test::read_file(file.string());
  REQUIRE(new_bytes != old_bytes);
  std::vector<std::string> points;
  {
    std::ifstream in(trace);
    for (std::string line; std::getline(in, line);) points.push_back(line);
  }
  CHECK(points == std::vector<std::string>{"tuning_cache.file_opened", "tuning_cache.file_half_written",
                                           "tuning_cache.file_written", "tuning_cache.file_synced",
                                           "tuning_cache.file_renamed", "tuning_cache.file_dir_synced"});
  for (const auto& p : points) {
    CAPTURE(p);
    write_old();
    status = in_child(p, "");
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    const std::string got = ax_test::read_file(file.string());
    CHECK((got == old_bytes || got == new_bytes));  // never a mix
    save_new();  // a rerun
    CHECK(ax_test::read_file(file.string()) == new_bytes);
  }
}

TEST_CASE("scattermoe tuning: without option tuning_cache the user file is the XDG or home cache") {
  const fs::path p = sm::default_user_cache_path();
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    CHECK(p == fs::path(x) / "axengine" / "scattermoe-tuning.json");
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    CHECK(p == fs::path(h) / ".cache" / "axengine" / "scattermoe-tuning.json");
  } else {
    CHECK(p.empty());  // nowhere to keep it: tuning results stay in memory
  }
}

TEST_CASE("scattermoe tile heuristic: big tiles for big problems, thin tiles for rank-r outputs") {
  using sm::GemmOp;
  // Wide outputs with many rows per expert: the 128x128 default.
  CHECK(sm::heuristic_tile(query(GemmOp::forward, 8, 8192, 28672, 4096)) == sm::kTile128x128);
  CHECK(sm::heuristic_tile(query(GemmOp::forward, 128, 32768, 1536, 2048)) == sm::kTile128x128);
  // Rank-16 outputs: the 128x16 thin tile, never a wide one.
  CHECK(sm::heuristic_tile(query(GemmOp::thin, 128, 32768, 16, 2048)) == sm::kTile128x16);
  // Gram products with J = 16 and J = 32.
  CHECK(sm::heuristic_tile(query(GemmOp::gram, 8, 8192, 4096, 16)) == sm::kTileGram128x16);
  CHECK(sm::heuristic_tile(query(GemmOp::gram, 8, 8192, 4096, 32)) == sm::kTileGram128x32);
  // Very few rows per expert (16): 64-row tiles waste less than 128-row ones.
  const int small = sm::heuristic_tile(query(GemmOp::forward, 256, 4096, 1024, 2048));
  CHECK(sm::kTileConfigs[small].bm == 64);
  // A tile not compiled for the variant is never chosen: fp16 has the defaults only.
  auto q = query(GemmOp::forward, 256, 4096, 1024, 2048);
  q.variant.bf16 = false;
  CHECK(sm::heuristic_tile(q) == sm::kTile128x128);
  q = query(GemmOp::thin, 256, 4096, 16, 2048);
  CHECK(sm::heuristic_tile(q) == sm::kTile128x16);
  q.variant.idx64 = true;  // 64-bit indexing: only 128x128 has it, thin outputs included
  CHECK(sm::heuristic_tile(q) == sm::kTile128x128);
  q = query(GemmOp::forward, 4, 1 << 20, 16, 64);
  q.variant.mixed = true;  // mixed orientations: only 128x128 has them
  CHECK(sm::heuristic_tile(q) == sm::kTile128x128);
  // A tile the GPU cannot run (occupancy 0) is never chosen.
  q = query(GemmOp::forward, 256, 4096, 1024, 2048);
  q.occupancy[sm::kTile64x128] = q.occupancy[sm::kTile64x64] = 0;
  CHECK(sm::kTileConfigs[sm::heuristic_tile(q)].bm == 128);
}

TEST_CASE("scattermoe 64-bit indexing is chosen exactly when M * ld can pass 2^31 - 1") {
  using sm::needs_idx64;
  const int64_t kMax = (int64_t{1} << 31) - 1;
  CHECK_FALSE(needs_idx64(32768, {2048, 16, 1536}));  // the benchmark shapes: 32-bit
  CHECK_FALSE(needs_idx64(kMax / 2048, {2048}));      // the last M that fits
  CHECK(needs_idx64(kMax / 2048 + 1, {2048}));
  CHECK(needs_idx64((int64_t{1} << 20) + 64, {64, 2048}));  // the conformance case index_over_2^31
  CHECK_FALSE(needs_idx64((int64_t{1} << 20) + 64, {64, 1024}));
  CHECK(needs_idx64(3, {kMax}));
  CHECK_FALSE(needs_idx64(1, {kMax}));
  CHECK_FALSE(needs_idx64(0, {kMax}));     // nothing to address
  CHECK_FALSE(needs_idx64(kMax, {0, 1}));  // unused operands (ld 0) do not count
}

TEST_CASE("scattermoe tile heuristic: tuning candidates are compiled and sized for the output") {
  using sm::GemmOp;
  auto wide = sm::candidate_tiles(query(GemmOp::forward, 128, 32768, 1536, 2048));
  CHECK(wide.size() == 4);  // 128x128, 128x64, 64x128, 64x64
  for (int t : wide) CHECK(sm::kTileConfigs[t].bn >= 64);
  auto thin = sm::candidate_tiles(query(GemmOp::thin, 128, 32768, 16, 2048));
  for (int t : thin) CHECK(sm::kTileConfigs[t].bn <= 32);
  CHECK(thin.size() == 2);  // 128x16, 128x32
  auto fp16 = query(GemmOp::forward, 128, 32768, 1536, 2048);
  fp16.variant.bf16 = false;
  CHECK(sm::candidate_tiles(fp16) == std::vector<int>{sm::kTile128x128});
  auto gram = sm::candidate_tiles(query(GemmOp::gram, 8, 8192, 4096, 16));
  CHECK(gram == std::vector<int>{sm::kTileGram128x16, sm::kTileGram128x32});
}

TEST_CASE("scattermoe split-K of the thin products: only where row tiles are few, bounded by K") {
  const int sms = 132;  // H200
  // mixtral XA (8 experts x 1024 rows, K = 4096): 72 tiles for 528 wanted -> 8 splits of 512.
  CHECK(sm::thin_split_k(8192, 8, 16, 4096, sms) == 8);
  // Backward YB at mixtral's gate_up (K = 28672): capped at 16.
  CHECK(sm::thin_split_k(8192, 8, 16, 28672, 1024) == 16);
  // Enough tiles already (qwen3-30b-a3b: 384 tiles): at most 2.
  CHECK(sm::thin_split_k(32768, 128, 16, 2048, sms) == 2);
  CHECK(sm::thin_split_k(131072, 128, 16, 2048, sms) == 1);
  // Short K: at least 256 per split.
  CHECK(sm::thin_split_k(8192, 8, 16, 512, sms) == 2);
  CHECK(sm::thin_split_k(8192, 8, 16, 200, sms) == 1);
  // Wide outputs are not thin; nothing to split without rows or SMs.
  CHECK(sm::thin_split_k(8192, 8, 64, 4096, sms) == 1);
  CHECK(sm::thin_split_k(0, 8, 16, 4096, sms) == 1);
  CHECK(sm::thin_split_k(8192, 8, 16, 4096, 0) == 1);
}
