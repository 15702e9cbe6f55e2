#include "train/dist_expert.hpp"

#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "models/hf_config.hpp"

namespace ax::train {
namespace {

class GroupComm : public ExpertComm {
 public:
  explicit GroupComm(DistGroup* g) : g_(g) {}
  int64_t rank() const override { return g_->rank(); }
  int64_t size() const override { return g_->world(); }
  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits) override {
    g_->all_to_all(out, in, out_splits, in_splits);
  }
  at::Tensor all_gather(const at::Tensor& in) override { return g_->all_gather(in); }

 private:
  DistGroup* g_;  // owned by ExpertParallelGroups::experts, which outlives the model (run.cpp)
};

}  // namespace

ExpertParallelGroups make_expert_parallel(DistGroup& world, int64_t size) {
  const int64_t W = world.world(), R = world.rank();
  if (size < 1 || W % size != 0)
    throw UsageError(ax::str("[distributed] expert_parallel = ", size, " does not divide the world size ", W,
                             " (ranks form groups of expert_parallel ranks)"));
  std::vector<int64_t> ep, rep;
  const int64_t g = R / size, pos = R % size;
  for (int64_t i = 0; i < size; ++i) ep.push_back(g * size + i);
  for (int64_t j = 0; j < W / size; ++j) rep.push_back(j * size + pos);
  ExpertParallelGroups out;
  out.experts = world.subgroup(ep, ax::str("ep", size, "/group", g));
  out.replicas = world.subgroup(rep, ax::str("ep", size, "/replicas", pos));
  out.comm = std::make_shared<GroupComm>(out.experts.get());
  log::info(ax::str("expert parallel: group ", g, " (ranks ", ep.front(), "..", ep.back(), "), position ", pos, " of ", size));
  return out;
}

void check_expert_parallel(const RunConfig& config, const DistributedConfig& d, const DistEnv& env, bool resuming,
                           bool exact_match) {
  const int64_t N = d.expert_parallel;
  if (N == 1 || !env.launched) return;
  auto fail = [&](const std::string& why) {
    config_fail(config.file, d.expert_parallel_at, ax::str("'distributed.expert_parallel' = ", N, ": ", why));
  };
  if (env.world % N != 0) fail(ax::str("it must divide the world size ", env.world, " (ranks form groups of N)"));
  const std::string cfg_path = (std::filesystem::path(config.model.path) / "config.json").string();
  const nlohmann::json j = models::read_json_file(cfg_path);
  int64_t experts = 0;
  for (const char* k : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (j.contains(k) && j[k].is_number_integer()) experts = std::max(experts, j[k].get<int64_t>());
  if (experts <= 0) fail(ax::str(cfg_path, " describes a model without experts"));
  if (experts % N != 0) fail(ax::str("it must divide the model's ", experts, " experts (", cfg_path, ")"));
  if (resuming) fail("resuming an expert-parallel run is not built yet (its checkpoint holds rank 0's optimizer state only)");
  if (exact_match) fail("eval.exact_match generates, which does not dispatch tokens to other ranks' experts; set it to false");
  // Each rank quantises only its own experts as they load. nf4's double quantisation takes the mean of a whole
  // tensor's absmax and quantises them in blocks of 256 that span experts, so a rank's share would differ from
  // one process's and the run would train against another base than merge-lora rebuilds. Plain nf4, mxfp4 and
  // nvfp4 give every rank the same bits (tests/unit/dist_multinode_test.cpp).
  if (config.model.weight_format == "nf4" && config.model.double_quant)
    fail("model.double_quant = true is not built for expert parallelism yet (its absmax statistics span the whole "
         "expert tensor, which each rank quantises in part); set model.double_quant = false");
}

bool is_expert_parameter(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

}  // namespace ax::train
