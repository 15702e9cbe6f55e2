// Gemma 3 multimodal's decode hooks (models/vl_decode.hpp): 1-D positions (no multimodal RoPE); a prefill's
// images become the soft tokens' embeddings, and each image's tokens attend each other (the attention op's
// groups, transformers' token_type_ids mask), as the training forward does. Later steps are text.
#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/gemma3_mm.hpp"

namespace ax::models {
namespace {

// The images' pixel_values [n_images, C, S, S], what Gemma 3's processor gives (undefined: none). Other extras (a
// dataset type's own) are not read, as the training forward does not read them.
at::Tensor gemma3_pixels(const DecodeImages& images) {
  auto pv = images.find("pixel_values");
  return pv == images.end() ? at::Tensor() : pv->second;
}

}  // namespace

at::Tensor Gemma3MmModel::prefill_positions(const at::Tensor& ids, const DecodeImages& images) const {
  const at::Tensor pv = gemma3_pixels(images);
  const int64_t n_images = pv.defined() ? pv.size(0) : 0, n_tokens = ids.eq(cfg_.image_token_id).sum().item<int64_t>();
  if (n_tokens != n_images * cfg_.mm_tokens_per_image)
    throw UsageError(str("gemma3: the tokens hold ", n_tokens, " image tokens (id ", cfg_.image_token_id, ") but ", n_images,
                         " images of mm_tokens_per_image ", cfg_.mm_tokens_per_image, " need ", n_images * cfg_.mm_tokens_per_image));
  return {};
}

DecoderModel::DecodeInputs Gemma3MmModel::splice_images(const at::Tensor& ids, const at::Tensor& cu, const DecodeImages& images) {
  DecoderModel::DecodeInputs in;
  const at::Tensor pv = gemma3_pixels(images);
  if (!pv.defined()) return in;
  at::Tensor embeds = text_->embed_tokens(ids.to(device_));
  at::Tensor feats = vision_->forward(pv).to(embeds.scalar_type());  // [n_images · mm_tokens_per_image, H], in order
  at::Tensor where = at::nonzero(ids.eq(cfg_.image_token_id)).squeeze(1).to(device_);
  in.embeds = embeds.index_put({where}, feats);
  in.attention_groups = image_groups(ids, cu, cfg_.image_token_id).to(device_);
  return in;
}

}  // namespace ax::models
