// The in-process context-parallel harness (context_parallel_test.cpp, context_parallel_gdn_test.cpp): N models, one
// per thread, joined by an in-memory group (ThreadComm); `train` runs SGD steps on them and sums their LoRA
// gradients as the trainer's reduction does, `check_close` compares such a trace with the single-process one.
#pragma once
#include <barrier>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/selection.hpp"
#include "models/context_parallel.hpp"
#include "models/decoder.hpp"

namespace ax::test::cp {

namespace fs = std::filesystem;

inline fs::path case_dir(const std::string& name) { return fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name; }

// N threads as a process group: each collective posts its tensor, waits for all, reads, waits again (so the next
// collective does not overwrite a slot still being read). Sums add the ranks in rank order, as Gloo's ring does
// not promise; the tolerance below covers either.
struct Shared {
  explicit Shared(int64_t n) : size(n), slots(static_cast<std::size_t>(n)), sync(static_cast<std::ptrdiff_t>(n)) {}
  int64_t size;
  std::vector<at::Tensor> slots;
  std::barrier<> sync;
  int64_t gathers = 0;  // collectives run (rank 0 counts)
  bool broken_ring = false;  // planted bug: a ring step hands each rank its own block back
  bool broken_gather = false;  // planted bug: an all-gather hands each rank its own tensor N times
};

class ThreadComm : public ax::models::ContextComm {
 public:
  ThreadComm(Shared& s, int64_t rank) : s_(s), rank_(rank) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return s_.size; }
  at::Tensor all_gather(const at::Tensor& in) override {
    post(in);
    at::Tensor out = s_.broken_gather ? at::cat(std::vector<at::Tensor>(static_cast<std::size_t>(s_.size), s_.slots[static_cast<std::size_t>(rank_)]), 0)
                                      : at::cat(s_.slots, 0);
    s_.sync.arrive_and_wait();
    return out;
  }
  void all_reduce_sum(at::Tensor& t) override {
    post(t);
    at::Tensor sum = s_.slots[0].clone();
    for (int64_t r = 1; r < s_.size; ++r) sum += s_.slots[static_cast<std::size_t>(r)];
    s_.sync.arrive_and_wait();
    t.copy_(sum);
  }
  at::Tensor ring_pass(const at::Tensor& in) override {
    post(in);
    const int64_t from = s_.broken_ring ? rank_ : (rank_ + s_.size - 1) % s_.size;
    at::Tensor out = s_.slots[static_cast<std::size_t>(from)].clone();
    s_.sync.arrive_and_wait();
    return out;
  }

 private:
  void post(const at::Tensor& t) {
    s_.slots[static_cast<std::size_t>(rank_)] = t.detach().clone();
    if (rank_ == 0) ++s_.gathers;
    s_.sync.arrive_and_wait();
  }
  Shared& s_;
  int64_t rank_;
};

inline std::unique_ptr<ax::Model> load(const std::string& name, bool checkpointing) {
  static ax::Registry reg = [] {
    ax::Registry r;
    ax::register_builtins(r);
    return r;
  }();
  const bool moe = name == "mixtral" || name == "gpt_oss";
  ax::LoraSpec spec;
  spec.targets = moe ? std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"}
                     : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"};
  if (name == "deepseek_v3")  // MLA's projections, the dense layer's and the experts' MLPs
    spec.targets = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  // Gated DeltaNet hybrids: every projection of the linear-attention layers, the attention's, the MLPs'.
  if (name == "qwen3_5" || name == "qwen3_5_vl")  // the multimodal checkpoint form: its language model
    spec.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
                    "gate_proj", "down_proj"};
  if (name == "qwen3_5_moe")
    spec.targets = {"q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "shared_expert_gate",
                    "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
  if (name == "qwen3_next")
    spec.targets = {"q_proj", "v_proj", "o_proj", "in_proj_qkvz", "in_proj_ba", "out_proj", "gate_proj", "up_proj", "down_proj"};
  at::manual_seed(7);  // every model the same LoRA
  ax::ModelLoadOptions o;
  o.dir = case_dir(name).string();
  o.dtype = "fp32";
  o.lora = spec;
  o.activation_checkpointing = checkpointing;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  auto m = ax::load_model(reg, o);
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (auto& [n, t] : m->trainable_parameters())
    if (n.find("lora_B") != std::string::npos) t.copy_(at::randn(t.sizes(), gen) * 0.1);  // A's gradients nonzero
  return m;
}

// 2 rows of 24 tokens (chunks of 6, 4 and 3 tokens for N = 2, 3, 4): row 0 packs samples of 5, 4, 3, 7 and 5
// tokens, row 1 of 17 and 7; labels everywhere but the first sample's first two tokens.
inline ax::Batch packed_batch(const std::string& name) {
  std::ifstream f(case_dir(name) / "config.json");
  const nlohmann::json cfg = nlohmann::json::parse(f);
  const int64_t vocab = cfg.value("text_config", cfg).at("vocab_size").get<int64_t>();  // a multimodal checkpoint's text part
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  ax::Batch b;
  b.input_ids = at::randint(vocab, {2, 24}, gen, at::kLong);
  b.labels = b.input_ids.clone();
  b.labels[0][0] = -100;
  b.labels[0][1] = -100;
  std::vector<int64_t> pos;
  for (int64_t len : {5, 4, 3, 7, 5, 17, 7})
    for (int64_t i = 0; i < len; ++i) pos.push_back(i);
  b.position_ids = at::tensor(pos, at::kLong).view({2, 24});
  b.cu_seqlens = at::tensor(std::vector<int32_t>{0, 5, 9, 12, 19, 24, 41, 48}, at::kInt);
  b.max_seqlen = 17;
  return b;
}

struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<at::Tensor>> grads;  // per step, the LoRA gradients (summed over the ranks)
};

// `steps` SGD steps on `models` (one: alone; N: a CP group of N threads). With `follow`, the steps apply its
// gradients instead of these: the parameters stay the reference's bit for bit, so each step compares that step's
// gradients alone (not round-off carried over from earlier steps, which SGD at lr 0.5 magnifies).
inline Trace train(std::vector<std::unique_ptr<ax::Model>>& models, const ax::Batch& b, int steps, const Trace* follow = nullptr,
            int64_t* collectives = nullptr) {
  const int64_t N = static_cast<int64_t>(models.size());
  Shared shared(N);
  std::vector<std::shared_ptr<ThreadComm>> comms;
  for (int64_t r = 0; r < N; ++r) {
    comms.push_back(std::make_shared<ThreadComm>(shared, r));
    if (N > 1) dynamic_cast<ax::models::DecoderModel&>(*models[static_cast<std::size_t>(r)]).set_context_parallel(comms.back());
  }
  Trace tr;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> loss(static_cast<std::size_t>(N));
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<std::size_t>(N));
    for (int64_t r = 0; r < N; ++r)
      threads.emplace_back([&, r] {
        try {
          auto& m = *models[static_cast<std::size_t>(r)];
          for (auto& [n, t] : m.trainable_parameters()) t.mutable_grad() = at::Tensor();
          auto out = m.forward(b, false);
          out.loss.backward();
          loss[static_cast<std::size_t>(r)] = out.loss.item<double>();
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
    for (double l : loss) CHECK(l == loss[0]);  // every rank reports the micro-batch's loss, bit for bit
    tr.losses.push_back(loss[0]);
    std::vector<at::Tensor> sum;
    for (const auto& m : models) {
      std::size_t i = 0;
      for (auto& [n, t] : m->trainable_parameters()) {
        REQUIRE_MESSAGE(t.grad().defined(), n);
        if (sum.size() <= i) sum.push_back(t.grad().clone());
        else sum[i] += t.grad();
        ++i;
      }
    }
    at::NoGradGuard ng;
    for (const auto& m : models) {
      std::size_t i = 0;
      for (auto& [n, t] : m->trainable_parameters()) {
        t.sub_(follow ? follow->grads[static_cast<std::size_t>(s)][i] : sum[i], 0.5);
        ++i;
      }
    }
    tr.grads.push_back(std::move(sum));
  }
  if (collectives) *collectives = shared.gathers;
  return tr;
}

// Losses to 1e-6, gradients to `grad_tol` of the larger of 1 and the tensor's largest magnitude at the first step
// (the same parameters on both sides: the split is the only difference), to 2 x grad_tol at later steps, whose
// parameters already carry the earlier steps' rounding differences (deepseek_v3 at N = 4, step 3: 1.013e-6 on an
// AMD EPYC host, where earlier hosts had measured at most 2.4e-7: MKL takes other code paths on other CPUs).
inline void check_close(const Trace& got, const Trace& want, double grad_tol = 1e-6) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-6 * std::max(1.0, std::abs(want.losses[s])));
    REQUIRE(got.grads[s].size() == want.grads[s].size());
    for (std::size_t i = 0; i < want.grads[s].size(); ++i) {
      CAPTURE(i);
      const at::Tensor& x = got.grads[s][i];
      const at::Tensor& y = want.grads[s][i];
      // By default as the tiled MLP tests (model_long_context_test.cpp): 1e-6 of the largest magnitude, at least 1. Measured:
      // at most 2.4e-7 (about 1.2e-6 of the tensor's own largest entry, fp32 sums over other token splits).
      const double scale = std::max(1.0, y.abs().max().item<double>());
      CHECK((x - y).abs().max().item<double>() <= (s == 0 ? 1 : 2) * grad_tol * scale);
      CHECK(y.abs().max().item<double>() > 0);  // a gradient that is there to compare
    }
  }
  CHECK(want.losses.front() != want.losses.back());  // the steps moved the parameters
}

// The family `name` (with activation checkpointing or not): 3 SGD steps of one process, then of N = 2, 3, 4 ranks
// (chunks of 6, 4 and 3 tokens of packed_batch: boundaries inside and between samples) following its parameters.
inline void check_family(const std::string& name, bool ckpt, double grad_tol = 1e-6) {
  CAPTURE(name);
  CAPTURE(ckpt);
  const ax::Batch b = packed_batch(name);
  std::vector<std::unique_ptr<ax::Model>> one;
  one.push_back(load(name, ckpt));
  const Trace want = train(one, b, 3);
  for (int64_t n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<std::unique_ptr<ax::Model>> group;
    for (int64_t r = 0; r < n; ++r) group.push_back(load(name, ckpt));
    int64_t collectives = 0;
    check_close(train(group, b, 3, &want, &collectives), want, grad_tol);
    CHECK(collectives > 0);  // the group did pass blocks
  }
}

}  // namespace ax::test::cp
