// [distributed] shard_base while loading (docs/distributed.md, "Sharding the frozen base", Load): every rank
// cuts each decoder layer to its chunk as soon as the load holds it, so the per-rank peak while loading is
// E + (B - E)/N plus about one layer (E: embeddings + final norm + lm_head, B: the whole base), not B.
// Measured on every rank's log (dense fp32 over 2 ranks, nf4 over 3), on Gloo, with spawned ranks.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

// Every rank's info lines (rank 0 alone logs them otherwise), for this test process's launches only.
struct EveryRankLogs {
  EveryRankLogs() { setenv("AXENGINE_LOG", "info", 1); }
  ~EveryRankLogs() { unsetenv("AXENGINE_LOG"); }
};

struct LoadFigures {
  int64_t layers = 0, resident = 0, whole = 0, share = 0, peak = 0;
};

// A short sharded run of `world` ranks on an 8-layer tiny Llama of hidden 256 (its layers are 97 % of the
// dense base, as in a real model); checks each rank's load peak against the bound and returns rank 0's
// figures.
LoadFigures check_load_peak(const std::string& name, int world, const std::vector<std::string>& sets) {
  EveryRankLogs every_rank;
  auto dir = ax::test::setup_run(name, "");
  fs::remove_all(dir / "model");
  ax::test::make_tiny_llama(dir / "model", 256, 8);
  std::vector<std::string> args{"launch", "--nproc", std::to_string(world), "--", "run", "--config", (dir / "run.toml").string()};
  for (const std::string& s : {"train.max_steps=1", "eval.every_steps=0", "eval.exact_match=false", "distributed.timeout_s=60",
                               "train.cpu_threads=1", "device.type=cpu", "distributed.shard_base=true"})
    args.insert(args.end(), {"--set", s});
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  const int rc = ax::test::run(args, dir / "run.log");
  const std::string log = slurp(dir / "run.log");
  if (rc != 0) MESSAGE(log);
  REQUIRE(rc == 0);

  // Every rank: "shard_base: the L layers' frozen tensors sharded over N ranks: R base bytes resident on this
  // rank (W whole), of which S are its share of the layers" (then "; peak P while loading").
  const std::regex line(R"(\[rank (\d+)/\d+\] shard_base: the (\d+) layers' frozen tensors sharded over (\d+) ranks: (\d+) base )"
                        R"(bytes resident on this rank \((\d+) whole\), of which (\d+) are its share of the layers(; peak (\d+) while loading)?)");
  std::vector<LoadFigures> ranks(static_cast<std::size_t>(world));
  std::vector<bool> seen(static_cast<std::size_t>(world), false);
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    const int r = std::stoi(m[1]);
    REQUIRE(r >= 0);
    REQUIRE(r < world);
    CHECK(std::stoi(m[3]) == world);
    ranks[r] = {std::stoll(m[2]), std::stoll(m[4]), std::stoll(m[5]), std::stoll(m[6]), m[8].matched ? std::stoll(m[8]) : -1};
    seen[r] = true;
  }
  for (int r = 0; r < world; ++r)
    if (!seen[r]) FAIL_CHECK("no shard_base line from rank ", r, ":\n", log);
  REQUIRE(seen[0]);
  // The bound for rank 0, whose summary reports its peak while loading (the model's WeightStats).
  auto bound_of = [world](const LoadFigures& f) {
    const int64_t E = f.resident - f.share, B = f.whole, layer = (B - E) / f.layers;
    return E + (B - E) / world + 2 * layer;
  };
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex(R"(base weights +\w+: .* peak [^(]*\((\d+) bytes\) while loading)")));
  const int64_t summary_peak = std::stoll(m[1]);
  CHECK(summary_peak <= bound_of(ranks[0]));  // a rank that loaded the whole base first peaked at B
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const LoadFigures& f = ranks[r];
    const int64_t E = f.resident - f.share, B = f.whole, bound = bound_of(f);
    MESSAGE("rank ", r, "/", world, ": base ", B, " bytes (E ", E, ", a layer ", (B - E) / f.layers, "), resident ", f.resident,
            ", peak while loading ", f.peak, " (bound E + (B-E)/N + 2 B_l = ", bound, ")");
    CHECK(E > 0);
    REQUIRE(f.peak >= 0);  // the line reports the load's peak
    CHECK(f.peak >= f.resident);  // the load ends holding what stays
    CHECK(f.peak <= bound);
    CHECK(f.peak < B * 8 / 10);  // clearly below one whole base (which every rank peaked at before)
  }
  CHECK(summary_peak == ranks[0].peak);
  const LoadFigures f = ranks[0];
  ax::test::remove_tree(dir);
  return f;
}

}  // namespace

TEST_CASE("shard_base load: 2 ranks, dense fp32: each rank's peak while loading is its half plus about a layer") {
  const LoadFigures f = check_load_peak("dist_shard_load2", 2, {});
  CHECK(f.share * 2 >= f.whole - (f.resident - f.share));
}

TEST_CASE("shard_base load: 3 ranks, nf4 quantised while loading: each rank's peak is its third plus about a layer") {
  const LoadFigures f = check_load_peak("dist_shard_load3", 3, {"model.weight_format=nf4", "model.double_quant=true"});
  CHECK(f.share * 3 >= f.whole - (f.resident - f.share));
}
