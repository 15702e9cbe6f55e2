// shard_base's storage (train/dist_shard.hpp): 2 and 3 Gloo ranks as threads of this process (each joins the
// group through the TCPStore like a process would), sharding tensors of several dtypes and odd sizes, gathered
// at once and started ahead (gather_async), and a buffer given as pieces (add_pieces).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>

#include "train/dist_group.hpp"
#include "unit/free_port.hpp"
#include "train/dist_shard.hpp"

namespace {

int64_t free_tcp_port() { return ax::test::free_tcp_port(); }

// The tensors a layer of a QLoRA model holds: a bf16 and an fp32 weight, packed 4-bit codes (uint8), a scalar
// scale, and sizes that do not divide by the world (padding) or are smaller than it.
std::vector<at::Tensor> base_tensors() {
  at::manual_seed(3);
  return {at::randn({7, 5}).to(at::kBFloat16), at::randn({3, 4, 2}), at::randint(0, 256, {33}, at::kByte),
          at::full({}, 0.375f), at::randn({1}).to(at::kBFloat16)};
}

void check_world(int64_t world) {
  const int64_t port = free_tcp_port();
  const std::vector<at::Tensor> want = base_tensors();
  int64_t full_bytes = 0;
  for (const auto& t : want) full_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  std::vector<int64_t> resident(static_cast<std::size_t>(world));
  std::vector<char> equal(static_cast<std::size_t>(world), 0);
  std::exception_ptr failed;
  std::mutex mu;
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        ax::train::DistEnv env;
        env.launched = true;
        env.rank = r;
        env.local_rank = r;
        env.world = world;
        env.master_port = port;
        ax::train::DistributedConfig cfg;
        cfg.backend = "gloo";
        cfg.timeout_s = 30;
        auto group = ax::train::DistGroup::join(env, cfg, ax::DeviceInfo{});
        // Copies of one set made before the threads: the global generator is not for concurrent use.
        std::vector<at::Tensor> mine;
        for (const auto& t : want) mine.push_back(t.clone());
        ax::train::ShardedTensors shards(*group, std::move(mine));
        resident[static_cast<std::size_t>(r)] = shards.resident_bytes();
        bool all = shards.size() == want.size();
        for (std::size_t i = 0; i < want.size(); ++i) {  // in the same order on every rank
          at::Tensor got = shards.gather(i);
          all &= got.scalar_type() == want[i].scalar_type() && got.sizes() == want[i].sizes() && at::equal(got, want[i]);
        }
        // Started ahead and waited for later (shard_base's prefetch), two in flight at once: the same bits.
        auto first = shards.gather_async(0), second = shards.gather_async(2);
        at::Tensor b = second.wait(), a = first.wait();
        all &= second.index() == 2 && at::equal(a, want[0]) && at::equal(b, want[2]) && a.sizes() == want[0].sizes();
        // A buffer given as pieces (shard_base cuts a loaded layer so, never building the buffer): the tensors
        // at offsets with gaps of 3 bytes, zero elsewhere, gathered as the built buffer would be; each rank
        // holds its chunk only.
        std::vector<ax::train::ShardedTensors::Piece> pieces;
        int64_t total = 0;
        for (const auto& t : want) {
          pieces.push_back({t.clone(), total});
          total += t.numel() * static_cast<int64_t>(t.element_size()) + 3;
        }
        at::Tensor built = at::zeros({total}, at::kByte);
        for (const auto& p : pieces) {
          at::Tensor bytes = p.tensor.reshape({-1}).view(at::kByte);
          built.narrow(0, p.offset, bytes.numel()).copy_(bytes);
        }
        shards.add_pieces(total, pieces);
        all &= shards.resident_bytes() - resident[static_cast<std::size_t>(r)] == (total + world - 1) / world;
        all &= at::equal(shards.gather(want.size()), built);
        equal[static_cast<std::size_t>(r)] = all;
        group->barrier();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        failed = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  if (failed) std::rethrow_exception(failed);
  for (int64_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(equal[static_cast<std::size_t>(r)]);  // every tensor back bit for bit, dtype and shape
    // 1/world of the bytes, plus at most world - 1 bytes of padding per tensor over all ranks.
    CHECK(resident[static_cast<std::size_t>(r)] * world >= full_bytes);
    CHECK(resident[static_cast<std::size_t>(r)] * world <= full_bytes + (world - 1) * static_cast<int64_t>(want.size()));
  }
}

}  // namespace

TEST_CASE("distributed: sharded frozen tensors keep 1/world of the bytes and gather back bit for bit") {
  SUBCASE("2 ranks") { check_world(2); }
  SUBCASE("3 ranks") { check_world(3); }
}
