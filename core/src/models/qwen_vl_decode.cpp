// The Qwen VLs' decode hooks (models/vl_decode.hpp): a row's prefill positions are transformers' get_rope_index
// of the row (mrope_positions), its images' merged features replace the image pads, and qwen3_vl's deepstack
// features join the image tokens' hidden states after the early layers, as the training forwards do.
#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/qwen2_5_vl.hpp"
#include "models/qwen3_vl.hpp"

namespace ax::models {
namespace {

// A row's (or a step's) images as the Qwen VL processor gives them: pixel_values [N, patch_dim] and their grids.
// Other extras (a dataset type's own) are not read, as the training forward does not read them.
struct QwenImages {
  at::Tensor pixel_values;
  Grids grids;
};

QwenImages qwen_images(const DecodeImages& images, int64_t merge, const std::string& family) {
  auto pv = images.find("pixel_values"), gt = images.find("image_grid_thw");
  if (pv == images.end() || gt == images.end())
    throw UsageError(str(family, ": images need \"pixel_values\" and \"image_grid_thw\" (the Qwen VL image processor's)"));
  return {pv->second, read_grids(gt->second, merge, family)};
}

at::Tensor qwen_prefill_positions(const at::Tensor& ids, const DecodeImages& images, const MropeTokens& tokens) {
  const Grids grids = images.empty() ? Grids{} : qwen_images(images, tokens.merge, tokens.family).grids;
  return mrope_positions(ids, at::tensor(std::vector<int64_t>{0, ids.size(0)}, at::kLong), grids, tokens);
}

MropeTokens rope_tokens(const VlConfig& c) {
  return {c.vision.spatial_merge_size, c.image_token_id, c.video_token_id, "qwen2_5_vl"};
}

}  // namespace

at::Tensor Qwen25VlModel::prefill_positions(const at::Tensor& ids, const DecodeImages& images) const {
  return qwen_prefill_positions(ids, images, rope_tokens(cfg_));
}

DecoderModel::DecodeInputs Qwen25VlModel::splice_images(const at::Tensor& ids, const at::Tensor&, const DecodeImages& images) {
  DecoderModel::DecodeInputs in;
  if (images.empty()) return in;
  const QwenImages im = qwen_images(images, cfg_.vision.spatial_merge_size, "qwen2_5_vl");
  at::Tensor embeds = text_->embed_tokens(ids.to(device_));
  at::Tensor feats = vision_->forward(im.pixel_values, im.grids).to(embeds.scalar_type());
  // prefill_positions checked each row's pad runs against its grids: the pads are the features, in order.
  at::Tensor where = at::nonzero(ids.eq(cfg_.image_token_id)).squeeze(1).to(device_);
  in.embeds = embeds.index_put({where}, feats);
  return in;
}

at::Tensor Qwen3VlModel::prefill_positions(const at::Tensor& ids, const DecodeImages& images) const {
  return qwen_prefill_positions(ids, images, cfg_.rope_tokens());
}

DecoderModel::DecodeInputs Qwen3VlModel::splice_images(const at::Tensor& ids, const at::Tensor&, const DecodeImages& images) {
  DecoderModel::DecodeInputs in;
  if (images.empty()) return in;
  const QwenImages im = qwen_images(images, cfg_.vision.spatial_merge_size, "qwen3_vl");
  at::Tensor embeds = text_->embed_tokens(ids.to(device_));
  auto feats = std::make_shared<Qwen3VisionTower::Features>(vision_->forward(im.pixel_values, im.grids));
  at::Tensor where = at::nonzero(ids.eq(cfg_.image_token_id)).squeeze(1).to(device_);
  in.embeds = embeds.index_put({where}, feats->merged.to(embeds.scalar_type()));
  // Deepstack (Qwen3VLTextModel._deepstack_process): feature k joins the image tokens after decoder layer k; the
  // prefill holds every image token, later steps none.
  in.after_layer = [feats, where](int64_t layer, const at::Tensor& h) {
    if (layer >= static_cast<int64_t>(feats->deepstack.size())) return h;
    return h.index_add(0, where, feats->deepstack[layer].to(h.scalar_type()));
  };
  return in;
}

}  // namespace ax::models
