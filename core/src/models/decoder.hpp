// The decoder-only transformer behind llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gemma3_text, olmoe,
// gpt_oss, qwen3_5(_moe), qwen3_next, glm4_moe and deepseek_v3: every layer an assembly of parts chosen once at
// construction from the config the family's description filled in (models/layer_parts.hpp).
// Its files: decoder_load.cpp (the constructor), decoder.cpp (weights, forward, parameters), decoder_layer.cpp
// (a layer's forward), decoder_decode.cpp (KV-cached decode), decoder_merge.cpp, decoder_unfrozen.cpp,
// decoder_residency.cpp, expert_parallel.cpp, moe_mlp_block.cpp, and each part's file (layer_parts.hpp).
//
// Weights are held under transformers 5 names (fused experts: mlp.experts.gate_up_proj [E, 2I, H],
// mlp.experts.down_proj [E, H, I], router mlp.gate.weight), whatever layout the checkpoint used.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "axengine/decode.hpp"
#include "axengine/expert_parallel.hpp"
#include "axengine/model.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/safetensors.hpp"
#include "models/context_parallel.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/hf_config.hpp"
#include "models/layer_parts.hpp"
#include "models/layer_residency.hpp"
#include "models/lora.hpp"

namespace ax {
class KernelSet;
}
namespace ax::ops {
struct AttentionArgs;
}  // namespace ax::ops

namespace ax::models {

struct DecodeStep;  // decoder_decode.cpp
class StorageSet;  // models/storage_set.hpp

class DecoderModel : public Model, public CausalLmDecode {
 public:
  // Reads the weights of `cfg` from `ckpt` (fused or per-expert) onto `device`: the projections `weights`
  // packs go into its format (quantised from the checkpoint's own dtype, one tensor at a time, so no dense
  // copy of the base stays resident), everything else is converted to `dtype`. The kernels for every
  // (op, weight format) the model holds are resolved here, so a missing one fails the load.
  // With `expert_parallel` (axengine/expert_parallel.hpp), only this rank's share of each MoE layer's experts
  // is read and held (models/expert_parallel.cpp).
  // With `layers` (shard_base, models/layer_residency.hpp), each layer's tensors go to it as soon as the load
  // holds them all (take_layer), and it holds them between uses from then on (recompute on): no more than
  // one layer is whole at a time, and weight_stats().peak_bytes is that load's peak.
  DecoderModel(HfConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
               std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights = {},
               std::shared_ptr<ExpertComm> expert_parallel = nullptr, std::shared_ptr<LayerResidency> layers = nullptr);

  ModelOutput forward(const Batch& batch, bool want_logits) override;
  // forward with the token embeddings given ([B*S, H] in the compute dtype; undefined: embedded from input_ids)
  // and the RoPE positions: int64 [3, B*S] for multimodal RoPE (cfg.mrope_section), undefined: position_ids.
  // For a family that splices other features into the embeddings (qwen2_5_vl). after_layer(i, h), where
  // given, replaces layer i's output h (qwen3_vl's deepstack adds vision features at the image tokens).
  // `attention_groups` (int32 [B*S] on the device, or undefined): the attention op's bidirectional groups for
  // every layer (gemma3's images).
  using LayerHook = std::function<at::Tensor(int64_t layer, const at::Tensor& h)>;
  ModelOutput forward_embeds(const Batch& batch, bool want_logits, const at::Tensor& embeds, const at::Tensor& rope_pos,
                             const LayerHook& after_layer = {}, const at::Tensor& attention_groups = {});
  at::Tensor embed_tokens(const at::Tensor& ids) const { return embed(ids); }
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const override;
  std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const override;
  void set_training(bool training) override { training_ = training; }
  // Recompute each layer in backward instead of keeping its activations (autograd::recompute). Always on
  // with a residency (shard_base): without it autograd would keep every gathered layer until backward.
  void set_activation_checkpointing(bool on) { recompute_layers_ = on || residency_ != nullptr; }
  void save_adapter(const std::string& dir) const override;
  // Expert parallelism (models/expert_parallel.cpp): the LoRA set narrowed to this rank's experts (a fresh or
  // loaded adapter covers all E; every rank narrows the same one, so the shards start equal to one process's);
  // and the full adapter gathered from the group (collective: every rank of the group calls it), which
  // save_adapter then writes. Without expert parallelism the first returns `full` and the second does nothing.
  LoraSet shard_expert_lora(LoraSet full) const;
  void gather_expert_lora();
  bool expert_parallel() const { return ep_ != nullptr; }
  // Context parallelism (models/context_parallel.hpp): a training forward (labels, no logits asked for) runs this
  // rank's tokens of every row, with attention over the whole rows gathered from `comm`'s group. Null: off.
  // Every rank of the group must run the same forwards (and backwards): the gathers are collectives.
  void set_context_parallel(std::shared_ptr<ContextComm> comm) { cp_ = std::move(comm); }
  // shard_base (models/layer_residency.hpp, models/decoder_residency.cpp): the slots of layer i's frozen
  // tensors (everything under model.layers.i.: norms, attention, MLP or experts, router, biases; the fields of
  // packed weights one by one), in one fixed order.
  std::vector<at::Tensor*> layer_base_tensors(int64_t i);
  WeightStats weight_stats() const override { return stats_; }
  // The bytes the base would have resident held whole (weight_stats().bytes without a residency).
  int64_t whole_base_bytes() const { return whole_bytes_; }
  // KV-cached incremental forward (axengine/decode.hpp), in decoder_decode.cpp.
  std::unique_ptr<KvCache> new_cache(int64_t batch, int64_t capacity) override;
  at::Tensor decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& cache) override;
  // decode with what a multimodal family's prefill brings (models/vl_decode.hpp), each undefined / empty where
  // not given: the step's token embeddings [T, H] (the new tokens packed row by row in row order, rows given
  // none left out; else embedded from the ids), their RoPE positions (int64 [3, T] multimodal; else each row's
  // length on), a hook after each layer (qwen3_vl's deepstack) and the attention op's bidirectional groups
  // (int32 [T]: gemma3's images; a prefill only, every row starting empty, as the op runs then).
  struct DecodeInputs {
    at::Tensor embeds, rope_pos, attention_groups;
    LayerHook after_layer;
  };
  at::Tensor decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& cache, const DecodeInputs& in);
  // MLA decode steps over a cache (models/parts/mla_layer.cpp): kv_b_proj absorbed into the queries and the
  // output (true, the default), or the cached latent expanded through it every step, as transformers does (false).
  void set_mla_absorb(bool on) { mla_absorb_ = on; }

  const HfConfig& config() const { return cfg_; }
  std::vector<LoraSite> lora_sites() const;
  void set_lora(LoraSet lora) { lora_ = std::move(lora); }
  const LoraSet& lora() const { return lora_; }
  // Base weights (packed ones dequantised) with the LoRA deltas folded in, as a checkpoint in the layout HF
  // save_pretrained writes (per-expert keys for MoE models), in `dtype`.
  std::vector<std::pair<std::string, at::Tensor>> merged_state_dict(at::ScalarType dtype) const;
  // [train] unfrozen_parameters (models/decoder_unfrozen.cpp): the base parameters `patterns` select
  // (models/unfrozen.hpp) become trainable leaves in `master` ("fp32" master weights, cast to the compute dtype
  // in every forward, or the compute dtype itself); they then appear in trainable_parameters() under their HF
  // names and the forward computes their gradients (through ATen where an op computes none for its weight).
  // `base_dir` is the model directory (the full-model export copies its config). Throws UsageError as
  // resolve_unfrozen does, and under expert parallelism or shard_base (neither carries trained base tensors).
  void unfreeze(const std::vector<std::string>& patterns, at::ScalarType master, const std::string& base_dir);
  // Base tensors replaced by an adapter's modules_to_save tensors (HF name -> values): checked against the
  // model (a dense base tensor of that shape), named by `source` in errors.
  void restore_saved(const std::map<std::string, at::Tensor>& saved, const std::string& source);
  const std::map<std::string, at::Tensor>& unfrozen() const { return unfrozen_; }

 private:
  // A base tensor other than a projection, in the compute dtype (an unfrozen one: its trainable value, cast).
  at::Tensor w(const std::string& name) const;
  // An unfrozen parameter (lm_head.weight: also the tied embeddings) in the compute dtype, differentiable to its
  // master; undefined when `name` is frozen. decoder_unfrozen.cpp.
  at::Tensor trained(const std::string& name) const;
  // linear() of a module whose weight or bias is unfrozen: through ATen, which computes the weight's gradient
  // (linear.lora computes none); undefined when neither is unfrozen. decoder_unfrozen.cpp.
  at::Tensor unfrozen_linear(const at::Tensor& x, const std::string& module);
  // save_adapter with unfrozen parameters: a peft adapter with modules_to_save where LoRA trains too and the
  // unfrozen parameters make whole modules, else a full model directory. decoder_unfrozen.cpp.
  void save_trained(const std::string& dir) const;
  const ops::WeightTensor& projection(const std::string& name) const;  // a frozen_ entry, e.g. "lm_head.weight"
  at::Tensor linear(const at::Tensor& x, const std::string& module);  // module path, e.g. model.layers.0.self_attn.q_proj
  friend struct Parts;  // each part names the member below that runs it (models/layer_parts.hpp)
  // The parts' forwards. Mixers (in.inv_freq: the layer's rotary frequencies; dynamic RoPE's depend on the batch):
  at::Tensor attention_block(int64_t layer, const at::Tensor& x, const LayerInputs& in);  // parts/attention.cpp
  // deepseek_v3's multi-head latent attention (models/parts/mla_layer.cpp).
  at::Tensor mla_block(int64_t layer, const at::Tensor& x, const LayerInputs& in);
  // A Gated DeltaNet layer's mixer (models/parts/gated_deltanet.cpp) and its linear_attention backend chain.
  at::Tensor gated_deltanet_block(int64_t layer, const at::Tensor& x, const LayerInputs& in);
  std::shared_ptr<ops::LinearAttention> linear_attention_backend();
  // Feed-forward parts; a MoE block appends its router logits for the aux loss (if its model's loss has one).
  at::Tensor swiglu_mlp(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);  // parts/dense_mlp.cpp
  at::Tensor gelu_mlp(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);
  at::Tensor moe_block(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);  // parts/moe_block.cpp
  at::Tensor gpt_oss_moe_block(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);  // gpt_oss_moe.cpp
  // deepseek_v3 / glm4_moe (MoeKind::group_topk_sigmoid): the group-limited sigmoid router and the experts
  // (models/parts/group_moe_block.cpp). No aux loss: these models' loss has none.
  at::Tensor group_moe_block(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);
  at::Tensor shared_expert(int64_t layer, const at::Tensor& x, std::vector<at::Tensor>& router_logits);  // parts/shared_expert.cpp
  // The layer's residual arrangements (decoder_layer.cpp): the whole layer, its parts `l` joined by its norms.
  at::Tensor prenorm_layer(int64_t layer, const LayerParts& l, const at::Tensor& h, const LayerInputs& in,
                           std::vector<at::Tensor>& router_logits);
  at::Tensor sandwich_layer(int64_t layer, const LayerParts& l, const at::Tensor& h, const LayerInputs& in,
                            std::vector<at::Tensor>& router_logits);
  // l's feed-forward part and shared expert over x, in token shards with [train] tiled_mlp.
  at::Tensor feed_forward(int64_t layer, const LayerParts& l, const at::Tensor& x, std::vector<at::Tensor>& router_logits);
  // While decode runs (decode_step_ set): appends a's k/v (after RoPE) to the cache and attends a's queries
  // over it, with a's scale, window and causality. A family's own attention calls it at the same point.
  at::Tensor cached_attention(int64_t layer, const ops::AttentionArgs& a);
  // Its pieces, for a mixer that caches something else than k and v (MLA's latent): the step's new tokens'
  // entries into layer `layer`'s cache (k: [T, ...], v: [T, ...] as the cache holds them), whether every row
  // started empty (a prefill: the attention op runs as in training), the step's rows' cached entries over the
  // key span [segments, L, ...], and a's queries attended over keys / values [segments, L, Hkv, D].
  void cache_store(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  bool decode_fresh() const;
  std::pair<at::Tensor, at::Tensor> cached_rows(int64_t layer) const;
  // The decode cache's slot for MLA layer `layer`'s absorbed kv_b_proj (undefined until the first step makes it:
  // the weights do not change while a cache lives).
  at::Tensor& cached_mla_absorbed(int64_t layer);
  at::Tensor attend_cached(const ops::AttentionArgs& a, const at::Tensor& keys, const at::Tensor& values);
  // While decode runs: linear-attention layer `layer`'s conv windows and recurrent states of the step's rows,
  // in segment order, and their update from the ops' final states (decoder_decode.cpp).
  std::pair<at::Tensor, at::Tensor> cached_linear_state(int64_t layer) const;
  void store_linear_state(int64_t layer, const at::Tensor& conv, const at::Tensor& state);
  at::Tensor embed(const at::Tensor& ids) const;  // the token embeddings [T, H] (times embed_scale where set)
  // The moe.experts routing of each token's top-k expert ids [T, k].
  ops::MoeRouting moe_routing(const at::Tensor& top_i) const;
  // The moe.mlp call of one layer's experts (`prefix`: "...mlp.experts."): its two weights and their LoRA are
  // filled in here, `a` holds the rest (x, routing, gates, biases, activation). models/moe_mlp_block.cpp.
  at::Tensor expert_mlp(ops::MoeMlpArgs a, const std::string& prefix);
  // The moe.mlp backend for a (gate_up, down) weight format pair: the resolved backend with its run-time
  // fallbacks, as one chain (cached: the chain logs each fallback once).
  std::shared_ptr<ops::MoeMlp> moe_mlp_backend(ops::WeightFormat gate_up, ops::WeightFormat down);
  // ep_first_ / ep_local_ from the group (UsageError when it does not divide the experts). expert_parallel.cpp.
  void init_expert_parallel();
  // The attention backend for the model's layout ("sinks" with per-head sinks, else "plain"): the resolved
  // backend with its run-time fallbacks (a backend may decline a call: docs/ops/attention.md), cached.
  std::shared_ptr<ops::Attention> attention_backend();
  // The rms_norm op on x (+ residual): {y, sum}; sum (x + residual, the residual stream) is undefined without
  // a residual. eps 0: the config's rms_norm_eps.
  std::pair<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const std::string& weight,
                                             const at::Tensor& residual = {}, double eps = 0) const;
  // Mean token cross-entropy of lm_head(h) through the linear_ce op, when lm_head is a dense frozen weight
  // without LoRA and nobody wants the logits; undefined when the op does not apply.
  // `count` (defined): the divisor instead of the targets' own count (context parallelism: the whole batch's).
  at::Tensor fused_loss(const at::Tensor& h, const at::Tensor& targets, const at::Tensor& count = {});
  at::Tensor aux_loss(const std::vector<at::Tensor>& router_logits, const at::Tensor& mask) const;  // mask: fp32 [T] or undefined
  // The LoRA factors in the compute dtype: {a, b} of module m, from this forward's batched cast
  // (cast_lora_factors) when there is one, else cast here.
  std::pair<at::Tensor, at::Tensor> lora_factors(const LoraModule& m) const;
  void cast_lora_factors();
  // The owner of the layers' tensors from now on (the constructor's `layers`): turns recompute on (the layer
  // runs again in backward instead of autograd keeping its tensors) and counts the layers' tensors in
  // weight_stats().bytes as the owner's resident_bytes().
  void set_layer_residency(std::shared_ptr<LayerResidency> residency);
  // While loading with a residency: layer i's tensors to `owner` (take_layer). `whole` (storages counted so
  // far) counts the layer's for whole_base_bytes. Returns the bytes the layer freed here and those the
  // owner keeps of it (the chunk exists before the layer is freed: both are resident for a moment).
  struct HandOver {
    int64_t whole = 0, freed = 0, kept = 0;
  };
  HandOver hand_over_layer(int64_t i, LayerResidency& owner, StorageSet& whole);
  // Decoder layer i (its parts' forwards, decoder_layer.cpp); appends the router logits of a MoE layer to
  // router_logits.
  at::Tensor layer(int64_t i, const at::Tensor& h, const LayerInputs& in, std::vector<at::Tensor>& router_logits);

  HfConfig cfg_;
  std::vector<LayerParts> layers_;  // every layer's parts (assemble_layers), chosen once at construction
  at::ScalarType dtype_;
  at::Device device_;
  std::shared_ptr<KernelSet> kernels_;
  std::map<std::string, at::Tensor> weights_;  // frozen base tensors other than projections (norms, embeddings, routers, biases)
  std::map<std::string, ops::WeightTensor> frozen_;  // frozen projections (models/weight_policy.hpp), in their own format
  WeightStats stats_;
  int64_t whole_bytes_ = 0;  // whole_base_bytes()
  at::Tensor inv_freq_;  // every type but dynamic: the one set; dynamic: at lengths up to max_position_embeddings
  at::Tensor inv_freq_local_;  // gemma3_text's sliding layers (cfg_.rope_local)
  at::Tensor attention_groups_;  // the current forward's (forward_embeds), read by attention()
  LoraSet lora_;
  std::map<std::string, at::Tensor> unfrozen_;  // trainable base parameters by HF name (their master values)
  std::string base_dir_;                        // the model directory, for the full-model export (unfreeze)
  mutable bool told_full_export_ = false;       // save_trained said once why it writes a full model
  std::map<const LoraModule*, std::pair<at::Tensor, at::Tensor>> lora_cast_;  // this forward's; see cast_lora_factors
  bool training_ = true;
  bool recompute_layers_ = false;
  DecodeStep* decode_step_ = nullptr;  // set by decode for the span of its forward
  bool mla_absorb_ = true;             // set_mla_absorb
  std::map<std::string, std::shared_ptr<ops::MoeMlp>> moe_mlp_chains_;  // by "<gate_up fmt>/<down fmt>"
  std::shared_ptr<ops::Attention> attention_chain_;
  std::shared_ptr<ops::LinearAttention> linear_attention_chain_;
  // Expert parallelism: the group, and this rank's experts [ep_first_, ep_first_ + ep_local_) of each MoE
  // layer (ep_local_ = num_experts without it). ep_gathered_: the full adapter of the last gather_expert_lora.
  std::shared_ptr<ExpertComm> ep_;
  int64_t ep_first_ = 0, ep_local_ = 0;
  std::optional<LoraSet> ep_gathered_;
  std::shared_ptr<ContextComm> cp_;
  std::optional<ContextSplit> cp_split_;  // the running CP forward's split (a layer recomputed in backward sets it again)
  std::shared_ptr<LayerResidency> residency_;  // shard_base: who holds the layers' tensors between uses
};

// The attention op of a model in `dtype` for `layout` ("sinks" or ""): the resolved backend and its run-time
// fallbacks as one chain (ops::attention_chain). Callers keep it: the chain logs each fallback once.
std::shared_ptr<ops::Attention> attention_chain_of(KernelSet& kernels, at::ScalarType dtype, const std::string& layout);

// The dtype a model directory's checkpoint stores (its first floating tensor; fp32 when none).
at::ScalarType checkpoint_dtype(const std::string& model_dir);
// `m` as a model directory in `dtype` into `out_dir` (existing): model.safetensors (merged_state_dict: LoRA and
// unfrozen parameters folded in), config.json from `model_dir` (dtype set, quantization_config dropped), and
// its generation and tokenizer files. For merge-lora and the full-model export of unfrozen parameters.
void write_model_dir(const DecoderModel& m, const std::string& model_dir, const std::string& out_dir, at::ScalarType dtype);

// Every place a LoRA adapter can go in a model of this config.
std::vector<LoraSite> lora_sites(const HfConfig& cfg);

}  // namespace ax::models
