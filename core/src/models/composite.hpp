// A model whose language model is a DecoderModel beside parts of its own (a vision tower, a projector): what
// `merge-lora` needs to fold an adapter into it and write a checkpoint its transformers class loads. A family
// (built in or a plugin's) implements CompositeModel on its Model; merge_lora_dir (models/tools.cpp) finds it.
#pragma once
#include <functional>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace ax::models {

class DecoderModel;

// How the checkpoint holds the language model beside the rest.
struct CompositeLayout {
  // The stored name of a language-model tensor, from the decoder's name (model.layers.0..., lm_head.weight).
  std::function<std::string(const std::string&)> text_name;
  // A stored tensor that is not the language model's: written as stored (the same bytes when the output
  // dtype is the base's; floating tensors cast to another one).
  std::function<bool(const std::string&)> kept;
  // A kept tensor's fp32 delta (by stored name): an adapter of the vision side folded into its weight, which is
  // then written as (stored + delta) in the output dtype.
  std::map<std::string, at::Tensor> kept_delta;
  // config.json's tie_word_embeddings for the language model, read from the composite config.
  std::function<bool(const nlohmann::json&)> tied;
};

class CompositeModel {
 public:
  virtual ~CompositeModel() = default;
  virtual DecoderModel& language_model() = 0;
  // The layout of the checkpoint in `model_dir` (the base this model was loaded from).
  virtual CompositeLayout checkpoint_layout(const std::string& model_dir) const = 0;
};

// write_model_dir (models/decoder.hpp) for a composite model: the merged language model under the layout's
// names, the kept tensors as stored, config.json (dtype updated) and the tokenizer / processor files.
void write_composite_model_dir(const DecoderModel& dm, const CompositeLayout& layout, const std::string& model_dir,
                               const std::string& out_dir, at::ScalarType dtype);

}  // namespace ax::models
