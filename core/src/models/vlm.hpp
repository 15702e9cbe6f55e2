// What the vision-language families (qwen2_5_vl, qwen3_vl, qwen3_vl_moe, gemma3 multimodal) share: a DecoderModel for the
// language model beside a frozen vision side (tower + projector) of the family's own.
//
//   VlDescription  what a family says of itself: its names, its LoRA family, how its checkpoint splits into the
//                  language model and the vision side, what `inspect` shows. Tools (inspect, merge-lora) read
//                  the descriptions, never a model_type.
//   VlModel        the Model + CompositeModel plumbing: parameters, training mode, adapter save, the checkpoint
//                  layout merge-lora writes, the batch's host tokens; generate / chat with images through
//                  VlDecode (models/vl_decode.hpp) over the language model, the family giving the prefill's
//                  positions and its image splice.
//   VlFamily       the ModelFamily + ModelFamilyCheck: dtype, LoRA / adapter checks and attachment, the op plan.
//
// A family implements build() / plan() on VlFamily and forward() on VlModel; see docs/models.md "Adding a family".
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "axengine/model.hpp"
#include "axengine/model_check.hpp"
#include "axengine/safetensors.hpp"
#include "models/composite.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "models/vision_lora.hpp"
#include "models/vl_decode.hpp"

namespace ax::models {

using TensorShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// What `axengine inspect` shows of a vision-language model beside its language model.
struct VlInspect {
  HfConfig text;
  std::string architecture;  // e.g. "qwen3_vl (language model qwen3)"
  std::string tower;         // one line: the tower's shape
  TensorShapes vision;       // the vision side's tensors, under the names of the description's vision view
  // Checks the vision view's sizes before anything is listed (a config claiming 10^9 blocks); may be empty.
  std::function<void(const safetensors::Checkpoint& vision_view)> check_sizes;
  // The vision side's linear layers (module names of the vision view, each with a [out, in] "<name>.weight" in
  // `vision`): its LoRA sites, which lora.vision_targets select (models/vision_lora.hpp). Empty: none.
  std::vector<std::string> linears;
};

struct VlDescription {
  std::string family;        // the registry name and config.json's model_type
  std::string lora_family;   // the language model's decoder family (make_lora / load_peft / all-linear)
  std::string exclude;       // adapter_config.json's exclude_modules in adapters we write: the vision side
  std::string vision_what;   // the vision side in messages: "vision tower", "vision tower or projector"
  // Substrings of a language-model target (lora.targets) that name a vision module: refused there, with a
  // pointer to lora.vision_targets.
  std::vector<std::string> vision_targets;
  // A stored tensor name -> the decoder's name (model.layers.*, lm_head.weight), or none for the vision side.
  std::function<std::optional<std::string>(const std::string&)> text_name;
  // A stored tensor name -> the name the vision side reads, or none for the language model.
  std::function<std::optional<std::string>(const std::string&)> vision_name;
  std::function<VlInspect(const nlohmann::json& config, const std::string& source)> inspect;
  // `axengine init-model --preset <preset>`: writes a tiny random model of the family (out_dir, seed).
  std::string preset;
  std::function<void(const std::string& out_dir, uint64_t seed)> init_preset;
  // The kind of image processor the model reads (DatasetContext::image_processor; a plugin implements it,
  // axengine/chat_media.hpp), named after the transformers 5 image processor class its AutoImageProcessor maps
  // the model_type to: "qwen2_vl" (Qwen2VLImageProcessor: smart resize to a multiple of patch × merge, patches,
  // merge; Qwen2.5-VL and Qwen3-VL, each with its own preprocessor_config.json), "gemma3" (Gemma3ImageProcessor:
  // every image resized to the tower's size, a fixed number of soft tokens).
  std::string image_processor;
};

// Every vision-language family's description (models/qwen2_5_vl_model.cpp, qwen3_vl_model.cpp, gemma3_mm.cpp).
const VlDescription& qwen2_5_vl_description();
const VlDescription& qwen3_vl_description();
const VlDescription& qwen3_vl_moe_description();  // models/qwen3_vl_moe.cpp
const VlDescription& gemma3_mm_description();
const std::vector<const VlDescription*>& vl_descriptions();
const VlDescription* find_vl_description(const std::string& model_type);  // nullptr: not a VL family
// (model_image_processor, axengine/models.hpp: a model dir's VlDescription::image_processor.)

// The checkpoint's language model under the decoder's names / its vision side under the tower's names / both
// (anything else as stored).
safetensors::Checkpoint vl_text_view(const VlDescription& d, const safetensors::Checkpoint& ckpt);
safetensors::Checkpoint vl_vision_view(const VlDescription& d, const safetensors::Checkpoint& ckpt);
safetensors::Checkpoint vl_view(const VlDescription& d, const safetensors::Checkpoint& ckpt);

// The language model's LoRA sites under transformers 5's module paths (model.language_model.layers.*), as peft
// names them in Qwen2.5-VL, Qwen3-VL and Gemma 3.
std::vector<LoraSite> vl_lora_sites(const HfConfig& text);

// The load's dtype: fp32, bf16 or fp16.
at::ScalarType vl_model_dtype(const ModelLoadOptions& o);

class VlModel : public Model, public CompositeModel, public VlDecode {
 public:
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const override;
  std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const override;
  void set_training(bool training) override;
  // The peft adapter, the language model's and the vision side's modules in one. Without vision modules,
  // exclude_modules is the description's: the target names (q_proj, gate_proj...) also name modules of the vision
  // side in transformers' module tree, and peft is told to leave it alone, as it is here. With them, the
  // target_modules hold both sides' names and exclude_modules every other module they name (exclude_regex).
  void save_adapter(const std::string& dir) const override;
  WeightStats weight_stats() const override { return text_->weight_stats(); }

  DecoderModel& text() { return *text_; }
  const DecoderModel& text() const { return *text_; }
  DecoderModel& language_model() override { return *text_; }
  // The language model under the stored names, the vision side kept as stored.
  CompositeLayout checkpoint_layout(const std::string& model_dir) const override;
  const VlDescription& description() const { return desc_; }
  // The vision side's adapters (lora.vision_targets, or those of a loaded adapter); empty: a frozen vision side.
  const VisionLora& vision_lora() const { return vision_lora_; }
  // `module_paths`: every module of the vision side under peft's paths (what the adapter's names could select).
  void set_vision_lora(LoraSet lora, std::vector<std::string> module_paths) {
    vision_lora_.set(std::move(lora));
    vision_module_paths_ = std::move(module_paths);
  }
  // What the load's log line says after the language model's size, e.g. "vision 2 blocks, hidden 32".
  virtual std::string vision_summary() const = 0;

 protected:
  VlModel(const VlDescription& desc, at::Device device) : desc_(desc), device_(device) {}
  DecoderModel& decode_text() override { return *text_; }  // VlDecode: the families give prefill_positions, splice_images
  // After the family's vision side is made (its errors come first): the language model from `ckpt`.
  void load_text(const HfConfig& text, const safetensors::Checkpoint& ckpt, at::ScalarType dtype,
                 std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights);
  // Warns about each tensor of the vision view that `used` does not hold.
  void warn_unused(const safetensors::Checkpoint& vision_view, const std::vector<std::string>& used) const;
  virtual const std::vector<std::pair<std::string, at::Tensor>>& vision_weights() const = 0;

  // A batch's tokens, checked: input_ids [B, S] with ids in the vocabulary, the spans (cu_seqlens rising from 0
  // to B*S, else whole rows) and host copies (Batch::to keeps them: a device batch is not read back).
  struct Tokens {
    int64_t T = 0;
    at::Tensor ids_host;  // int64 [T], host
    at::Tensor cu;        // host
    at::Tensor ids;       // int64 [T], on the device
  };
  Tokens tokens(const Batch& batch) const;

  const VlDescription& desc_;
  at::Device device_;
  std::unique_ptr<DecoderModel> text_;
  // The family's tower calls its linear layers through it (made with the tower's dtype and kernels).
  VisionLora vision_lora_;
  std::vector<std::string> vision_module_paths_;
};

class VlFamily : public ModelFamily, public ModelFamilyCheck {
 public:
  explicit VlFamily(const VlDescription& desc) : desc_(desc) {}
  std::unique_ptr<Model> load(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override;
  ModelCheck check(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override;

 protected:
  // The model of the config in `o.dir` (config.json already read), without LoRA.
  virtual std::unique_ptr<VlModel> build(const nlohmann::json& hf_config, const ModelLoadOptions& o,
                                         const safetensors::Checkpoint& ckpt, at::ScalarType dtype) const = 0;
  // What check() needs of the family: the config parsed, the vision side's tensors checked against it.
  struct Plan {
    HfConfig text;
    std::string summary;         // ModelCheck::summary
    std::vector<OpCall> vision;  // the vision side's kernel calls
    std::vector<std::string> text_ops_left_out;  // decoder ops this model never calls
  };
  virtual Plan plan(const nlohmann::json& hf_config, const std::string& source, const safetensors::Checkpoint& ckpt) const = 0;

  const VlDescription& desc_;

 private:
  void check_lora_request(const ModelLoadOptions& o) const;  // both given, vision modules named by lora.targets
  // The adapters the load asks for: the language model's and the vision side's (o.device; the dtype's).
  struct Adapters {
    LoraSet text, vision;
  };
  // The vision sites o.lora's vision_targets select (checked; none without them).
  std::vector<LoraSite> selected_vision_sites(const nlohmann::json& hf_config, const ModelLoadOptions& o) const;
  Adapters plan_adapters(const nlohmann::json& hf_config, const ModelLoadOptions& o, const HfConfig& text, at::ScalarType dtype,
                         at::Device device) const;
};

}  // namespace ax::models
