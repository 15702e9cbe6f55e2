// Small stand-ins for the trainer and data tests: a byte tokenizer and a one-layer causal transformer that
// honours packed batches (position_ids per sample, attention confined to each cu_seqlens span), so packing,
// optimisation and resume are tested against a real, if tiny, language model.
#pragma once
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include "axengine/model.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/tokenizer.hpp"

namespace ax::test {

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(std::string fp = "bytes-v1") : fp_(std::move(fp)) {}
  std::vector<int32_t> encode(const std::string& text, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (auto i : ids) s += i < 256 ? std::string(1, static_cast<char>(i)) : std::string("<eos>");
    return s;
  }
  int64_t vocab_size() const override { return 258; }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 256; }
  int32_t pad_id() const override { return 257; }
  std::string fingerprint() const override { return fp_; }

 private:
  std::string fp_;
};

class TinyLM final : public Model {
 public:
  explicit TinyLM(int64_t dim = 32, int64_t vocab = 258, uint64_t seed = 7) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto init = [&](std::vector<int64_t> shape) { return (at::randn(shape, gen, at::kFloat) * 0.1).set_requires_grad(true); };
    p_ = {{"embed.weight", init({vocab, dim})}, {"pos.weight", init({512, dim})},
          {"attn.q.weight", init({dim, dim})},  {"attn.k.weight", init({dim, dim})},
          {"attn.v.weight", init({dim, dim})},  {"norm.weight", at::ones({dim}).set_requires_grad(true)},
          {"head.weight", init({vocab, dim})}};
  }

  int nan_after_calls = -1;  // > 0: the loss turns NaN after this many training forwards (to test the guard)
  bool nan_eval_loss = false;  // eval forwards (autograd off) return a NaN loss
  // > 0: after this many evals, a row of pos.weight no batch reaches becomes NaN: weights gone bad while the
  // loss and the gradients stay finite (what only a check of the saved tensors catches).
  int nan_weight_after_evals = 0;

  std::vector<Batch> training_batches;  // with record_batches: every training forward's batch
  bool record_batches = false;
  // Mixed precision: the math in `compute` (fp16: fp32 parameters cast per forward, as LoRA master weights are)
  // with the loss in fp32 (as transformers takes it from upcast logits), times `loss_weight` (tiny or huge
  // gradients for the loss-scaling tests).
  at::ScalarType compute = at::kFloat;
  double loss_weight = 1;

  ModelOutput forward(const Batch& b, bool want_logits) override {
    if (at::GradMode::is_enabled()) ++calls_;  // training forwards only
    if (record_batches && at::GradMode::is_enabled()) training_batches.push_back(b);
    const int64_t B = b.input_ids.size(0), S = b.input_ids.size(1), N = B * S;
    auto w = [&](const std::string& name) { return this->w(name).to(compute); };  // a no-op in fp32
    at::Tensor x = at::embedding(w("embed.weight"), b.input_ids.reshape({N})) + at::embedding(w("pos.weight"), b.position_ids.reshape({N}));
    // Span id of every flattened token, from cu_seqlens: attention only within a span, causally.
    at::Tensor cu = b.cu_seqlens.to(at::kLong);
    at::Tensor span = at::searchsorted(cu.slice(0, 1), at::arange(N, at::kLong), /*out_int32=*/false, /*right=*/true);
    at::Tensor idx = at::arange(N, at::kLong);
    at::Tensor allowed = span.unsqueeze(1).eq(span.unsqueeze(0)).logical_and(idx.unsqueeze(1).ge(idx.unsqueeze(0)));
    at::Tensor q = at::matmul(x, w("attn.q.weight").t()), k = at::matmul(x, w("attn.k.weight").t()),
               v = at::matmul(x, w("attn.v.weight").t());
    at::Tensor scores = at::matmul(q, k.t()) / std::sqrt(static_cast<double>(x.size(1)));
    scores = scores.masked_fill(allowed.logical_not(), compute == at::kFloat ? -1e9 : -INFINITY);  // -1e9 overflows fp16
    at::Tensor h = x + at::matmul(at::softmax(scores, -1), v);
    h = h * w("norm.weight");
    at::Tensor logits = at::matmul(h, w("head.weight").t()).view({B, S, -1});
    at::Tensor lg = logits.slice(1, 0, S - 1).reshape({-1, logits.size(2)});
    at::Tensor lb = b.labels.slice(1, 1, S).reshape({-1});
    ModelOutput out;
    out.loss = at::cross_entropy_loss(lg.to(at::kFloat), lb, {}, at::Reduction::Mean, -100);
    if (loss_weight != 1) out.loss = out.loss * loss_weight;
    if (nan_after_calls > 0 && calls_ > nan_after_calls) out.loss = out.loss * NAN;
    if (nan_eval_loss && !at::GradMode::is_enabled()) out.loss = out.loss * NAN;
    if (want_logits) out.logits = logits;
    return out;
  }
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const override { return p_; }
  std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const override { return p_; }
  void set_training(bool on) override {
    if (!on) ++evals_;
    if (on && nan_weight_after_evals > 0 && evals_ >= nan_weight_after_evals) {
      at::NoGradGuard no_grad;
      w("pos.weight")[511].fill_(NAN);
    }
  }
  void save_adapter(const std::string& dir) const override {
    ax::safetensors::save(dir + "/adapter_model.safetensors", p_);
    ax::safetensors::write_file_atomic(dir + "/adapter_config.json", "{\"peft_type\": \"LORA\"}\n");
  }

  at::Tensor w(const std::string& name) const {
    for (const auto& [n, t] : p_)
      if (n == name) return t;
    return {};
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> p_;
  int calls_ = 0;
  int evals_ = 0;
};

}  // namespace ax::test
