// Models: a model family (registry kind "model", keyed by HF config.json "model_type") builds a Model
// from a Hugging Face model directory. Models call kernel ops through a KernelSet, never a backend
// directly, so plugins swap kernels in without touching model code.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace ax {

class KernelSet;
class ExpertComm;  // axengine/expert_parallel.hpp

// A packed batch: rows of `sequence_len` tokens, each row holding one or more samples.
struct Batch {
  at::Tensor input_ids;     // [B, S] int64
  at::Tensor labels;        // [B, S] int64, -100 = ignored
  at::Tensor position_ids;  // [B, S] int64, restarting at 0 for every packed sample
  at::Tensor cu_seqlens;    // [n+1] int32 cumulative sample lengths over the flattened B*S tokens
  int64_t max_seqlen = 0;
  // Named extra inputs collated by the dataset type (DatasetType::collate): images, pixel values, grids,
  // per-token position ids of several axes... A model family reads the names it knows and ignores the
  // rest, so a text-only model trains on a multimodal batch's tokens unchanged.
  std::map<std::string, at::Tensor> extras;

  // Host-side facts, recorded while the batch is still on the CPU, so that a forward validates a device
  // batch without reading it back (a host sync that would stall the GPU and break CUDA-graph capture).
  at::Tensor cu_seqlens_host;                   // cu_seqlens on the CPU (undefined: not known)
  int64_t min_token_id = 0, max_token_id = -1;  // range of input_ids (max < min: not known)
  at::Tensor input_ids_host;                    // input_ids on the CPU (undefined: not known)
  // The integer extras on the CPU (grids, indices: what a model family builds host-side tables from, e.g.
  // Qwen2.5-VL's rope and window indices); floating extras (pixel values) are not kept twice.
  std::map<std::string, at::Tensor> extras_host;

  // Records the host facts (when the tensors are on the CPU), then moves every tensor, extras included, to
  // `device`: from pinned host memory, non_blocking, so the copies overlap the previous step's work.
  Batch to(const at::Device& device) const;
};

// A host tensor moved to `device` without the host waiting for the GPU: from pinned memory, non_blocking
// (a plain .to(device) from pageable memory synchronises the stream). Other tensors: .to(device).
at::Tensor to_device_async(const at::Tensor& t, const at::Device& device);

struct ModelOutput {
  at::Tensor logits;    // [B, S, V] (may be left undefined when only the loss is asked for)
  at::Tensor loss;      // scalar: mean token cross-entropy (+ aux loss where the model has one)
  at::Tensor aux_loss;  // router load-balancing loss, undefined for dense models
};

// LoRA on a model's linear layers. Targets are module names as in peft's target_modules: a name matches a
// module whose path equals it or ends with "." + name (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
// down_proj; MoE experts: gate_up_proj / down_proj, or gate_proj+up_proj / down_proj (w1+w3 / w2 for
// Mixtral), which — as peft does for transformers 5 fused experts — become one rank-2r LoRA on the fused
// gate_up_proj and leave the dense MLP layers of a MoE model without LoRA).
struct LoraSpec {
  std::vector<std::string> targets;
  // lora.vision_targets: modules of a vision-language model's vision side (tower, projector) that get an adapter
  // too; `targets` are then the language model's. A family without a vision side refuses a non-empty list.
  std::vector<std::string> vision_targets;
  int64_t r = 8;
  double alpha = 16.0;
  double dropout = 0.0;       // on the LoRA branch's input while training (not supported on experts, as in peft)
  bool rslora = false;        // scaling alpha/sqrt(r) instead of alpha/r
  std::string dtype = "fp32"; // LoRA weights: "fp32" or "compute" (the model's compute dtype)
  uint64_t seed = 0;          // A: kaiming-uniform as peft; B: zeros
};

// How a model holds its frozen base (QLoRA when not dense). The per-module policy, as bitsandbytes / peft
// QLoRA: the projections of attention (q/k/v/o_proj), of the MLP (gate/up/down_proj) and of the MoE experts
// are packed into `format`; embeddings, lm_head, routers, norms and biases stay in the compute dtype.
// docs/weights.md.
struct WeightPolicy {
  std::string format = "dense";           // dense | nf4 | mxfp4 | nvfp4
  std::vector<std::string> skip_modules;  // projections kept in the compute dtype (matching: docs/weights.md)
  int64_t blocksize = 64;                 // nf4: elements per absmax block
  bool double_quant = false;              // nf4: quantise the absmax as well
};

// What the frozen base holds, measured on its tensors (storage bytes, each storage counted once).
struct WeightStats {
  std::string format = "dense";
  int64_t params = 0;               // logical elements of every frozen base tensor
  int64_t bytes = 0;                // resident bytes of the frozen base
  int64_t packed_params = 0;        // elements held in `format` (0 when dense)
  int64_t packed_bytes = 0;         // their bytes, scales included
  int64_t peak_bytes = 0;           // most base bytes resident at once while loading (dense copies included)
  std::vector<std::string> kept;    // projections the policy kept in the compute dtype, with why
};

class Model {
 public:
  virtual ~Model() = default;
  // Labels follow HF: aligned with input_ids (the model shifts them); a label whose position_id is 0 (the
  // first token of a packed sample) is never predicted from the previous sample.
  virtual ModelOutput forward(const Batch& batch, bool want_logits) = 0;
  // All parameters by HF name (base and LoRA), and the trainable subset. A packed base weight appears as its
  // fields: NAME (the codes), NAME.scales, NAME.nested_scales, NAME.global_scale.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() const = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const = 0;
  virtual void set_training(bool training) = 0;  // LoRA dropout on/off
  // The LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors), loadable by peft.
  virtual void save_adapter(const std::string& dir) const = 0;
  // The frozen base's resident size; a family that does not measure it returns the defaults.
  virtual WeightStats weight_stats() const { return {}; }
};

struct ModelLoadOptions {
  std::string dir;                 // HF model directory
  std::string dtype = "fp32";      // compute dtype: fp32 | bf16 | fp16
  std::string device = "cpu";      // "cpu" or "cuda:N"
  std::shared_ptr<KernelSet> kernels;
  std::optional<LoraSpec> lora;    // a fresh adapter...
  std::string adapter_dir;         // ...or a PEFT adapter directory to load (then trainable)
  // Recompute each decoder layer's activations in backward instead of keeping them ([train]
  // activation_checkpointing): less memory, ~1/3 more compute. Families that cannot may ignore it.
  bool activation_checkpointing = false;
  WeightPolicy weights;            // [model] weight_format, skip_modules, quant_blocksize, double_quant
  // Expert parallelism: this rank loads and trains only its share of each MoE layer's experts and dispatches
  // tokens to the others through it (axengine/expert_parallel.hpp). Null: every expert here. Families without
  // experts refuse it.
  std::shared_ptr<ExpertComm> expert_parallel;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::unique_ptr<Model> load(const nlohmann::json& hf_config, const ModelLoadOptions& options) const = 0;
};

}  // namespace ax
