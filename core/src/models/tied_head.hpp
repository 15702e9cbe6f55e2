// tie_word_embeddings against a checkpoint that stores its own output head, resolved as transformers 5.23
// resolves it while loading (PreTrainedModel.tie_weights with the checkpoint's keys): when both
// lm_head.weight and the embeddings are stored and their values differ, the config is taken to be wrong, the
// stored head is kept untied, and transformers warns. Equal values (torch .bin checkpoints store both) are tied.
#pragma once
#include <string>

#include "axengine/safetensors.hpp"
#include "models/hf_config.hpp"

namespace ax::models {

// True when `cfg` ties the head (tie_word_embeddings, given or the family's default) but `ckpt` stores
// lm_head.weight and `embed_key` with different values (or shapes, or a packed head). Reads both tensors.
bool stored_head_differs(const HfConfig& cfg, const safetensors::Checkpoint& ckpt,
                         const std::string& embed_key = "model.embed_tokens.weight");

// stored_head_differs, and then `cfg` unties (tie_word_embeddings = false) with one warning naming the files:
// what a model load does. Returns whether it untied.
bool untie_stored_head(HfConfig& cfg, const safetensors::Checkpoint& ckpt);

}  // namespace ax::models
