// No host sync inside a training step, and a model forward + backward that a CUDA graph can capture.
//
// 1. The real trainer (run_trainer) trains the tiny Qwen3 test model with its LoRA adapter on the GPU
//    under [profile]; the profiler counts, per scope, the CUDA launches and the host-synchronising CUDA
//    calls issued inside it (by any thread). Inside axengine::forward_backward (every micro-batch's
//    forward and backward) and axengine::step (batch building and upload, clipping, the non-finite check
//    and the optimizer step included) there must be none: the step's numbers come back through
//    axengine::read_step, an event wait while the next step already runs. The same steps also run under
//    c10's sync debug mode, which flags every synchronising ATen call (item(), blocking copies, ...).
// 2. One forward + backward of the same model is captured in a CUDA graph and replayed, against the eager
//    results, also after new token ids are copied into the captured batch. A host sync during capture
//    fails the capture itself. Graph-safe today are the reference attention (masked, no host loop, given
//    max_seqlen), linear.lora and norm_rope backends, so the dense model runs on them; the MoE reference
//    backend reads routing offsets on the host and is not (scattermoe is: scattermoe_graph_test).
// Built with CUDA (tests/cuda/CMakeLists.txt); every case says "skipped" and passes without a GPU.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "axengine/builtins.hpp"
#include "axengine/config.hpp"
#include "axengine/models.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/registry.hpp"
#include "axengine/selection.hpp"
#include "axengine/tokenizer.hpp"
#include "data/packing.hpp"
#include "data/prepare.hpp"
#include "train/trainer.hpp"

namespace fs = std::filesystem;

namespace {

bool no_gpu() {
  if (at::hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0) return false;
  MESSAGE("skipped: no CUDA device");
  return true;
}

const fs::path kModel = fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "qwen3";  // vocab 53, 2 layers

// Ids as text ("3 17 5"): enough of a tokenizer for pretokenized data and the model's 53-token vocabulary.
class IdTokenizer final : public ax::Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text, bool) const override {
    std::vector<int32_t> ids;
    std::istringstream in(text);
    for (int32_t i; in >> i;) ids.push_back(i);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (auto i : ids) s += std::to_string(i) + " ";
    return s;
  }
  int64_t vocab_size() const override { return 53; }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 1; }
  int32_t pad_id() const override { return 0; }
  std::string fingerprint() const override { return "ids-53"; }
};

std::unique_ptr<ax::Model> load_tiny(const ax::Registry& reg) {
  ax::ModelLoadOptions o;
  o.dir = kModel.string();
  o.dtype = "fp32";
  o.device = "cuda:0";
  o.adapter_dir = (kModel / "adapter").string();  // loaded as trainable LoRA
  ax::DeviceInfo dev;
  dev.type = ax::DeviceInfo::Type::cuda;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, dev);
  return ax::load_model(reg, o);
}

// Counts c10's "called a synchronizing CUDA operation" warnings (sync debug mode), on every thread that
// reports to this one (autograd replays its workers' warnings on the caller).
struct SyncCounter : c10::WarningHandler {
  int64_t syncs = 0;
  std::string first;
  void process(const c10::Warning& w) override {
    if (w.msg().find("synchroniz") == std::string::npos) return;
    if (!syncs++) first = w.msg();
  }
};

// "    axengine::forward_backward: 6x, 1234 launches (205.7 each), 0 host syncs" -> (launches, syncs)
std::pair<int64_t, int64_t> scope_line(const std::string& summary, const std::string& scope) {
  std::smatch m;
  std::regex re(scope + R"(: (\d+)x, (\d+) launches \([^)]*\), (\d+) host syncs)");
  if (!std::regex_search(summary, m, re)) return {-1, -1};
  return {std::stoll(m[2]), std::stoll(m[3])};
}

}  // namespace

TEST_CASE("training step on CUDA: no host sync inside forward and backward nor anywhere in the step") {
  if (no_gpu()) return;
  const fs::path dir = fs::temp_directory_path() / ("axengine_step_sync_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream rows(dir / "ids.jsonl");
    for (int i = 0; i < 64; ++i) {  // 64 samples of 5..20 tokens: several per packed row
      rows << "{\"input_ids\": [";
      for (int k = 0, n = 5 + (i * 7) % 16; k < n; ++k) rows << (k ? ", " : "") << 2 + (i * 13 + k * 5) % 50;
      rows << "]}\n";
    }
    std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\nseed = 5\n"
                                       "[data]\nsequence_len = 64\neval_fraction = 0.0\ncache = false\n"
                                       "[[datasets]]\ntype = \"pretokenized\"\npath = \"ids.jsonl\"\n"
                                       "[train]\nlr = 0.001\nmax_steps = 6\nmicro_batch_size = 2\ngrad_accum = 2\nmax_grad_norm = 1.0\n"
                                       "[checkpoint]\nevery_steps = 0\n"
                                       "[profile]\nstart_step = 2\nsteps = 3\n";
  }
  ax::Registry reg;
  ax::register_builtins(reg);
  IdTokenizer tok;
  ax::RunConfig cfg = ax::load_config((dir / "run.toml").string(), {});
  auto model = load_tiny(reg);
  ax::train::TrainerSetup s;
  s.config = &cfg;
  s.registry = &reg;
  s.device.type = ax::DeviceInfo::Type::cuda;
  s.device.index = 0;
  s.model = model.get();
  s.pad_id = 0;
  s.eos_id = 1;
  s.data_config = ax::data::read_data_config(cfg);
  s.data = ax::data::prepare_datasets(cfg, s.data_config, reg, tok);
  s.train = ax::train::read_train_config(cfg);
  s.checkpoint = ax::train::read_checkpoint_config(cfg);
  s.eval = ax::train::read_eval_config(cfg);
  s.profile = ax::train::read_profile_config(cfg);
  s.write_adapter = [&](const std::string& d) { model->save_adapter(d); };

  auto sum = ax::train::run_trainer(s);
  REQUIRE(sum.steps == 6);
  CHECK(std::isfinite(sum.final_loss));

  std::ifstream in(dir / "out" / "profile" / "summary.txt");
  std::string summary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MESSAGE(summary);
  auto [fb_launches, fb_syncs] = scope_line(summary, "axengine::forward_backward");
  auto [step_launches, step_syncs] = scope_line(summary, "axengine::step");
  REQUIRE_MESSAGE(fb_launches > 0, "the profile lists no CUDA launches inside axengine::forward_backward");
  CHECK(fb_syncs == 0);
  CHECK(step_launches >= fb_launches);
  CHECK(step_syncs == 0);
  fs::remove_all(dir);
}

TEST_CASE("training step on CUDA: sync debug mode flags no synchronising call in forward or backward or the optimizer step") {
  if (no_gpu()) return;
  ax::Registry reg;
  ax::register_builtins(reg);
  auto model = load_tiny(reg);
  std::vector<ax::Sample> samples;
  for (int i = 0; i < 8; ++i) {
    ax::Sample smp;
    for (int k = 0; k < 6 + 3 * i; ++k) smp.input_ids.push_back(2 + (i * 11 + k * 7) % 50);
    smp.labels = smp.input_ids;
    samples.push_back(smp);
  }
  std::vector<uint32_t> order(samples.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  auto packed = ax::data::pack_samples(samples, order, 48);
  std::vector<uint32_t> rows(packed.rows.size());
  for (uint32_t i = 0; i < rows.size(); ++i) rows[i] = i;
  const at::Device cuda(at::kCUDA, 0);
  ax::ParamGroup group;
  for (auto& [n, p] : model->trainable_parameters()) group.params.push_back(p.requires_grad_(true));
  REQUIRE(!group.params.empty());
  auto provider = reg.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "adamw");
  REQUIRE(provider);
  auto opt = provider->create({group}, toml::table{});  // implementation "auto": the fused kernel on CUDA
  at::Tensor found_inf = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(cuda));
  // The trainer's step in short: host-built batch, forward, backward, norm, the non-finite flag, clipping
  // and the optimizer step told to skip on the device.
  auto step = [&] {
    ax::Batch b = ax::data::make_batch(samples, packed, rows, 48, 0).to(cuda);
    ax::ModelOutput out = model->forward(b, false);
    out.loss.backward();
    at::NoGradGuard ng;
    std::vector<at::Tensor> grads;
    for (auto& p : group.params) grads.push_back(p.mutable_grad());
    at::Tensor norm = at::stack(at::_foreach_norm(grads, 2, at::kFloat)).norm();
    found_inf = at::maximum(found_inf, at::logical_not(at::isfinite(norm) & at::isfinite(out.loss)).to(at::kFloat));
    at::_foreach_mul_(grads, at::where(norm > 1.0, 1.0 / (norm + 1e-6), at::ones_like(norm)));
    opt->step(1e-3, found_inf);
    opt->zero_grad();
  };
  step();  // warm-up: allocator, cuBLAS handles, pinned host blocks
  SyncCounter counter;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&counter);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    step();
    step();
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  CHECK_MESSAGE(counter.syncs == 0, "first: " << counter.first);
  // The counter is real: an item() in the same mode is counted.
  {
    c10::WarningUtils::WarningHandlerGuard guard(&counter);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    (void)found_inf.item<float>();
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  CHECK(counter.syncs >= 1);
}

TEST_CASE("CUDA graph: one forward and backward of a dense model on the reference backends is captured and replayed") {
  if (no_gpu()) return;
  ax::Registry reg;
  ax::register_builtins(reg);
  auto model = load_tiny(reg);
  model->set_training(false);  // no LoRA dropout: the eager and the replayed results must agree
  auto params = model->trainable_parameters();
  REQUIRE(!params.empty());
  for (auto& [n, p] : params) p.requires_grad_(true);
  const at::Device cuda(at::kCUDA, 0);

  // A static packed batch [2, 24] of three samples and a padding span; new ids are copied into it later.
  const int64_t B = 2, S = 24;
  auto host_ids = [&](int seed) { return at::randint(2, 52, {B, S}, at::TensorOptions().dtype(at::kLong)).add_(seed % 2); };
  at::manual_seed(11);
  ax::Batch hb;
  hb.input_ids = host_ids(0);
  hb.labels = hb.input_ids.clone();
  hb.position_ids = at::cat({at::arange(10), at::arange(14), at::arange(20), at::arange(4)}).view({B, S});
  hb.cu_seqlens = at::tensor({0, 10, 24, 44, 48}, at::kInt);
  hb.max_seqlen = 20;
  ax::Batch b = hb.to(cuda);

  auto clear_grads = [&] {
    for (auto& [n, p] : params) p.mutable_grad() = at::Tensor();
  };
  auto eager = [&]() {
    clear_grads();
    ax::ModelOutput out = model->forward(b, false);
    out.loss.backward();
    std::vector<at::Tensor> r{out.loss.detach().clone()};
    for (auto& [n, p] : params) r.push_back(p.grad().clone());
    return r;
  };

  // Warm-up on a side stream (cuBLAS handles, autograd's device threads), as torch.cuda.graph does.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard sg(side);
    for (int i = 0; i < 3; ++i) eager();
  }
  c10::cuda::device_synchronize();

  at::cuda::CUDAGraph graph;
  at::Tensor loss;
  std::vector<at::Tensor> grads;
  {
    c10::cuda::CUDAStreamGuard sg(side);
    clear_grads();
    graph.capture_begin();
    ax::ModelOutput out = model->forward(b, false);
    out.loss.backward();
    graph.capture_end();
    loss = out.loss.detach();
    for (auto& [n, p] : params) grads.push_back(p.grad());  // the graph writes these on every replay
  }
  REQUIRE(grads.size() == params.size());
  for (const auto& g : grads) REQUIRE(g.defined());

  auto compare = [&](const char* what) {
    CAPTURE(what);
    graph.replay();
    c10::cuda::device_synchronize();
    std::vector<at::Tensor> replayed{loss.clone()};
    for (const auto& g : grads) replayed.push_back(g.clone());
    std::vector<at::Tensor> want = eager();
    REQUIRE(replayed.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(at::allclose(replayed[i], want[i], /*rtol=*/1e-5, /*atol=*/1e-7));
    }
    return replayed[0].item<double>();
  };
  const double first = compare("captured batch");
  // New tokens in the captured input: the replay must follow them (nothing was baked in on the host).
  at::Tensor ids2 = host_ids(1);
  b.input_ids.copy_(ids2);
  b.labels.copy_(ids2);
  b.min_token_id = ids2.min().item<int64_t>();
  b.max_token_id = ids2.max().item<int64_t>();
  const double second = compare("new token ids");
  CHECK(first != second);
}
