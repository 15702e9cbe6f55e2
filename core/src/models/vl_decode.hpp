// KV-cached decode for the vision-language families (qwen2_5_vl, qwen3_vl, gemma3): axengine/decode.hpp's
// CausalLmDecode and ImageDecode over the family's text decoder (DecoderModel::decode with DecodeInputs).
//   - A row's images come with its prefill (its first tokens): the family splices their features into the
//     step's embeddings at the placeholder tokens (and, qwen3_vl, adds deepstack features after the early
//     layers; gemma3, attends bidirectionally within each image), as its training forward does.
//   - Multimodal RoPE (the Qwen VLs): the prefill's [3, n] positions are transformers' get_rope_index of the
//     row; each later token's three positions are its index in the row plus the row's delta,
//     max(prefill positions) + 1 - n, as transformers' generate continues them from its rope_deltas.
// Rows without images decode as the text model does (positions 0, 1, ... on all three axes).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "axengine/decode.hpp"
#include "models/decoder.hpp"

namespace ax::models {

class VlDecode : public CausalLmDecode, public ImageDecode {
 public:
  std::unique_ptr<KvCache> new_cache(int64_t batch, int64_t capacity) override;
  at::Tensor decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& cache) override;
  at::Tensor decode_images(const std::vector<std::vector<int64_t>>& tokens, const std::vector<DecodeImages>& images,
                           KvCache& cache) override;

 protected:
  virtual DecoderModel& decode_text() = 0;
  // One row's prefill, its tokens `ids` (host int64 [n]) against its images (empty: none): throws UsageError when
  // the placeholders do not match the images; returns the tokens' multimodal RoPE positions int64 [3, n]
  // (undefined: the family rotates by 1-D positions).
  virtual at::Tensor prefill_positions(const at::Tensor& ids, const DecodeImages& images) const = 0;
  // The step's inputs with the images spliced in: `ids` the step's tokens (host int64 [T], packed row by row as
  // DecodeInputs says), `cu` their rows' spans (host int64, 0 ... T), `images` the prefilled rows' images, each
  // extra concatenated along dim 0 in row order (empty: no row has any). Sets embeds (and after_layer,
  // attention_groups where the family has them); rope_pos is the caller's.
  virtual DecoderModel::DecodeInputs splice_images(const at::Tensor& ids, const at::Tensor& cu, const DecodeImages& images) = 0;
};

}  // namespace ax::models
