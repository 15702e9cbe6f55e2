#include "train/dist_context.hpp"

#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "models/hf_config.hpp"

namespace ax::train {
namespace {

class ContextGroupComm : public models::ContextComm {
 public:
  explicit ContextGroupComm(DistGroup* g) : g_(g) {}
  int64_t rank() const override { return g_->rank(); }
  int64_t size() const override { return g_->world(); }
  at::Tensor all_gather(const at::Tensor& in) override { return g_->all_gather(in); }
  void all_reduce_sum(at::Tensor& t) override { g_->all_reduce_sum(t); }
  // The ring step as an all-to-all in which each rank sends to rank + 1 only (and so receives from rank - 1 only).
  // Started and not waited for: NCCL runs it on the group's stream while the compute stream goes on.
  std::function<at::Tensor()> ring_pass_start(const at::Tensor& in) override {
    const int64_t N = g_->world(), r = g_->rank(), n = in.numel();
    std::vector<int64_t> to(static_cast<std::size_t>(N), 0), from(static_cast<std::size_t>(N), 0);
    to[static_cast<std::size_t>((r + 1) % N)] = n;
    from[static_cast<std::size_t>((r + N - 1) % N)] = n;
    at::Tensor src = in.contiguous().view({-1}), out = at::empty_like(src);
    std::shared_ptr<DistWork> work = g_->all_to_all_async(out, src, from, to);
    return [work, src, out, sizes = in.sizes().vec()] {
      work->wait();
      return out.view(sizes);
    };
  }
  at::Tensor ring_pass(const at::Tensor& in) override { return ring_pass_start(in)(); }

 private:
  DistGroup* g_;  // owned by ContextParallelGroups::group, which outlives the model (run.cpp)
};

}  // namespace

ContextParallelGroups make_context_parallel(DistGroup& world, int64_t size) {
  const int64_t W = world.world(), R = world.rank();
  if (size < 1 || W % size != 0)
    throw UsageError(ax::str("[distributed] context_parallel = ", size, " does not divide the world size ", W,
                             " (ranks form groups of context_parallel ranks)"));
  std::vector<int64_t> ranks;
  const int64_t g = R / size;
  for (int64_t i = 0; i < size; ++i) ranks.push_back(g * size + i);
  ContextParallelGroups out;
  out.group = world.subgroup(ranks, ax::str("cp", size, "/group", g));
  out.comm = std::make_shared<ContextGroupComm>(out.group.get());
  log::info(ax::str("context parallel: group ", g, " (ranks ", ranks.front(), "..", ranks.back(), "), chunks ",
                    R % size, " and ", 2 * size - 1 - R % size, " of ", 2 * size, " of every row (ring attention)"));
  return out;
}

void check_context_parallel(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, int64_t sequence_len) {
  const int64_t N = d.context_parallel;
  if (N == 1 || !env.launched) return;
  auto fail = [&](const std::string& why) {
    config_fail(config.file, d.context_parallel_at, ax::str("'distributed.context_parallel' = ", N, ": ", why));
  };
  if (env.world % N != 0) fail(ax::str("it must divide the world size ", env.world, " (ranks form groups of N)"));
  if (sequence_len % (2 * N) != 0)
    fail(ax::str("2 x N must divide data.sequence_len = ", sequence_len,
                 " (each rank holds 2 zig-zag chunks of sequence_len / 2N tokens of every row)"));
  if (d.expert_parallel > 1) fail(ax::str("not together with expert_parallel = ", d.expert_parallel, " (choose one)"));
  if (d.shard_base) fail("not together with shard_base = true (choose one)");
  const std::string cfg_path = (std::filesystem::path(config.model.path) / "config.json").string();
  const nlohmann::json j = models::read_json_file(cfg_path);
  const std::string type = j.value("model_type", std::string());
  models::HfConfig hf;
  std::string unparsed;
  try {
    hf = models::parse_hf_config(j, cfg_path);
  } catch (const std::exception& e) {
    unparsed = e.what();
  }
  // Any vision-language checkpoint (qwen2_5_vl, qwen3_vl, gemma3 ...): the model splices vision features into whole
  // rows. Not a multimodal checkpoint read for its language model only (Qwen3.5's: HfConfig::text_part, the tower
  // not read): that is a text decoder.
  if (j.contains("vision_config") && (!unparsed.empty() || !hf.text_part))
    fail(ax::str(cfg_path, " (", type, "): a vision-language model splices vision features into whole rows; not split over ranks"));
  if (!unparsed.empty()) fail(ax::str(cfg_path, " (", type, ") is not a built-in decoder family that splits its rows: ", unparsed));
  // Gated DeltaNet layers: a chunk's conv1d window reaches W-1 tokens back, into the previous chunk only
  // (models/parts/gdn_context_parallel.hpp).
  if (!hf.linear_layers.empty() && hf.gdn.conv_kernel - 1 > sequence_len / (2 * N))
    fail(ax::str(cfg_path, " (", type, "): its Gated DeltaNet conv1d window (linear_conv_kernel_dim = ", hf.gdn.conv_kernel,
                 ") reaches past a chunk of data.sequence_len / 2N = ", sequence_len / (2 * N), " tokens"));
}

}  // namespace ax::train
