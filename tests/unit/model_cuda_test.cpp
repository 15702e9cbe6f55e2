// The model parity goldens on a CUDA device through the reference backends: fp32 to the CPU tolerances
// and bf16 to documented looser ones; and bf16 again through the default selection (core's production
// `aten` linear.lora, flash attention, rms_norm, swiglu and linear_ce), to the same bf16 tolerances. Without a CUDA device each case
// says so and passes; on the GPU machine they are real.
//
// bf16 tolerances (the goldens are fp32): weights, activations and LoRA factors are rounded to bf16
// (8 bits of mantissa, relative step 2^-8 ≈ 0.4%) and errors compound over the layers, so:
//   logits: max |diff| ≤ 5e-2 × max(1, max |golden logit|); loss: ≤ 2% relative;
//   LoRA grads (fp32 factors, bf16 activations): norm-relative ≤ 1e-1.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/decoder.hpp"

namespace fs = std::filesystem;

namespace {

bool no_cuda() {
  if (at::hasCUDA()) return false;
  MESSAGE("no CUDA device: nothing to compare on this machine");
  return true;
}

// The reference backends only (the default list would pick `aten` for bf16).
ax::KernelPreferences reference_only() {
  ax::KernelPreferences p;
  for (const char* op : {"linear.lora", "attention", "norm_rope", "moe.experts", "moe.mlp", "dequant", "rms_norm", "swiglu", "linear_ce"})
    p.prefer[op] = {"reference"};
  return p;
}

// `adapter` / `golden`: the case's peft adapter dir and its golden file (gpt_oss's expert LoRA has its own pair).
void check_on_cuda(const std::string& name, const std::string& dtype, double logit_tol, double loss_tol, double grad_tol,
                   const ax::KernelPreferences& prefs, const std::string& adapter = "adapter",
                   const std::string& golden = "golden.safetensors") {
  CAPTURE(name);
  CAPTURE(dtype);
  ax::Registry reg;
  ax::register_builtins(reg);
  const fs::path dir = fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name;
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.dtype = dtype;
  o.device = "cuda:0";
  o.adapter_dir = (dir / adapter).string();
  const ax::DeviceInfo dev = ax::detect_device("cuda");  // the real arch: attention/aten needs sm_80+
  o.kernels = std::make_shared<ax::KernelSet>(reg, prefs, dev);
  auto model = ax::load_model(reg, o);
  auto g = ax::safetensors::File::open((dir / golden).string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  b.labels = g->get("labels");
  auto out = model->forward(b, true);
  at::Tensor want = g->get("logits");
  at::Tensor got = out.logits.to(at::kCPU, at::kFloat);
  CHECK((got - want).abs().max().item<double>() <= logit_tol * std::max(1.0, want.abs().max().item<double>()));
  double loss = out.loss.item<double>(), want_loss = g->get("loss").item<double>();
  CHECK(std::abs(loss - want_loss) <= loss_tol * std::abs(want_loss));
  out.loss.backward();
  auto* dm = dynamic_cast<ax::models::DecoderModel*>(model.get());
  REQUIRE(dm);
  for (const auto& m : dm->lora().modules) {
    CAPTURE(m.site.path);
    at::Tensor ga = m.a.grad().to(at::kCPU, at::kFloat), gb = m.b.grad().to(at::kCPU, at::kFloat);
    if (m.site.experts)
      gb = gb.view({gb.size(0), m.site.num_experts, m.r}).permute({0, 2, 1}).reshape({gb.size(0), -1});
    at::Tensor wa = g->get("grad." + m.peft_key + ".lora_A.weight"), wb = g->get("grad." + m.peft_key + ".lora_B.weight");
    CHECK((ga - wa).norm().item<double>() <= grad_tol * wa.norm().item<double>());
    CHECK((gb - wb).norm().item<double>() <= grad_tol * wb.norm().item<double>());
  }
}

const char* kCases[] = {"llama", "qwen2", "mistral", "qwen3", "qwen3_yarn", "llama_dynamic", "qwen3_moe", "qwen3_moe_top1", "mixtral",
                        "gemma3", "olmoe", "gpt_oss", "gpt_oss_mxfp4"};
// The LoRA-gradient tolerance of a bf16 run against the fp32 transformers golden (fp32 parity on CUDA holds at
// 1e-4 for every case; the bf16 backends are held to the op contracts by conformance):
// - yarn: transformers multiplies cos and sin by the attention factor and rounds them to bf16; we fold its square
//   into the softmax scale (fp32), so in bf16 the two differ by more rounding than the other families: one LoRA
//   gradient measured 12.4% off on an H200.
// - olmoe and gpt_oss: their goldens are built so the clamps bite (olmoe clip_qkv 1.1 on q/k/v; gpt_oss's GLU
//   limit 0.6 / 1.5 at init scale) and a clamp's gradient is 0 or 1: in bf16 values near the limit land on the
//   other side, which moves whole gradient entries. Measured on an H200 (2026-11-24): olmoe 32% (layer 0 k_proj
//   lora_B), gpt_oss 29% (o_proj, aten backends; 16% with the reference ones).
// Logits: 5% of the largest logit, except gpt_oss (the dense-weight golden): transformers' own bf16 run of it is
// 5.9% off its fp32 golden on the same inputs (measured on CPU with transformers 5.23; ours on an H200: 5.8%, the
// same with reference and aten backends).
double bf16_logit_tol(const std::string& c) { return c == "gpt_oss" ? 8e-2 : 5e-2; }
double bf16_grad_tol(const std::string& c) {
  if (c == "olmoe" || c.rfind("gpt_oss", 0) == 0) return 4e-1;
  return c == "qwen3_yarn" ? 1.5e-1 : 1e-1;
}

}  // namespace

TEST_CASE("model parity on CUDA, fp32, reference backends") {
  if (no_cuda()) return;
  for (const char* c : kCases) check_on_cuda(c, "fp32", 1e-4, 1e-5, 1e-4, reference_only());
}

// gpt_oss's experts with peft's target_parameters LoRA (tests/unit/model_gpt_oss_lora_test.cpp's goldens), dense and
// MXFP4 base, through moe.mlp on the GPU.
TEST_CASE("model parity on CUDA, fp32, reference backends: gpt_oss expert LoRA") {
  if (no_cuda()) return;
  for (const char* c : {"gpt_oss", "gpt_oss_mxfp4"})
    check_on_cuda(c, "fp32", 1e-4, 1e-5, 1e-4, reference_only(), "expert_adapter", "expert_golden.safetensors");
}

// The hybrid Gated DeltaNet families (not yet in kCases: their bf16 tolerances are unmeasured), fp32: the
// linear_attention and causal_conv1d ops by the default selection on CUDA, the rest by reference.
TEST_CASE("model parity on CUDA, fp32: the hybrid families (qwen3_5, qwen3_5_moe, qwen3_next, the multimodal forms)") {
  if (no_cuda()) return;
  for (const char* c : {"qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3_5_vl", "qwen3_5_moe_vl"})
    check_on_cuda(c, "fp32", 1e-4, 1e-5, 1e-4, reference_only());
}

// glm4_moe / deepseek_v3 (the group router, shared experts, MLA with Dv != D through the attention op): fp32 on the
// GPU, with the reference backends and with the default selection; bf16 in the case after this one.
TEST_CASE("model parity on CUDA, fp32: glm4_moe and deepseek_v3 (reference backends and default selection)") {
  if (no_cuda()) return;
  for (const char* c : {"glm4_moe", "glm4_moe_qknorm", "deepseek_v3", "deepseek_v3_qproj"}) {
    check_on_cuda(c, "fp32", 1e-4, 1e-5, 1e-4, reference_only());
    check_on_cuda(c, "fp32", 1e-4, 1e-5, 1e-4, ax::KernelPreferences{});
  }
}

// Their bf16 tolerances, measured on the CPU beside transformers' own bf16 run of the same cases
// (model_deepseek_glm_test.cpp, "bf16 on the CPU ..."): logits 5%, loss 2%, LoRA grads 10%; deepseek_v3 (YaRN
// factor 40: cos/sin scaled and rounded to bf16, the softmax scale mscale² larger) 8%, 2%, 35%.
TEST_CASE("model parity on CUDA, bf16: glm4_moe and deepseek_v3 (reference backends and default selection)") {
  if (no_cuda()) return;
  for (const std::string c : {"glm4_moe", "glm4_moe_qknorm", "deepseek_v3", "deepseek_v3_qproj"}) {
    const bool yarn = c == "deepseek_v3";
    check_on_cuda(c, "bf16", yarn ? 8e-2 : 5e-2, 2e-2, yarn ? 3.5e-1 : 1e-1, reference_only());
    check_on_cuda(c, "bf16", yarn ? 8e-2 : 5e-2, 2e-2, yarn ? 3.5e-1 : 1e-1, ax::KernelPreferences{});
  }
}

TEST_CASE("model parity on CUDA, bf16, reference backends (documented tolerances)") {
  if (no_cuda()) return;
  for (const char* c : kCases) check_on_cuda(c, "bf16", bf16_logit_tol(c), 2e-2, bf16_grad_tol(c), reference_only());
}

TEST_CASE("model parity on CUDA, bf16, default selection (production aten backends)") {
  if (no_cuda()) return;
  for (const char* c : kCases) check_on_cuda(c, "bf16", bf16_logit_tol(c), 2e-2, bf16_grad_tol(c), ax::KernelPreferences{});
}
