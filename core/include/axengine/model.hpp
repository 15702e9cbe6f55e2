// Models: a model family (registry kind "model", keyed by HF config.json "model_type") builds a Model
// from a Hugging Face model directory. Models call kernel ops through a KernelSet, never a backend
// directly, so plugins swap kernels in without touching model code.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace ax {

class KernelSet;

// A packed batch: rows of `sequence_len` tokens, each row holding one or more samples.
struct Batch {
  at::Tensor input_ids;     // [B, S] int64
  at::Tensor labels;        // [B, S] int64, -100 = ignored
  at::Tensor position_ids;  // [B, S] int64, restarting at 0 for every packed sample
  at::Tensor cu_seqlens;    // [n+1] int32 cumulative sample lengths over the flattened B*S tokens
  int64_t max_seqlen = 0;
};

struct ModelOutput {
  at::Tensor logits;    // [B, S, V] (may be left undefined when only the loss is asked for)
  at::Tensor loss;      // scalar: mean token cross-entropy (+ aux loss where the model has one)
  at::Tensor aux_loss;  // router load-balancing loss, undefined for dense models
};

class Model {
 public:
  virtual ~Model() = default;
  virtual ModelOutput forward(const Batch& batch, bool want_logits) = 0;
  // All parameters by HF name (base and LoRA), and the trainable subset.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() const = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const = 0;
};

struct ModelLoadOptions {
  std::string dir;                 // HF model directory
  std::string dtype = "fp32";      // compute dtype: fp32 | bf16 | fp16
  std::string device = "cpu";      // "cpu" or "cuda:N"
  std::shared_ptr<KernelSet> kernels;
  // Recompute each decoder layer's activations in backward instead of keeping them ([train]
  // activation_checkpointing): less memory, ~1/3 more compute. Families that cannot may ignore it.
  bool activation_checkpointing = false;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::unique_ptr<Model> load(const nlohmann::json& hf_config, const ModelLoadOptions& options) const = 0;
};

}  // namespace ax
