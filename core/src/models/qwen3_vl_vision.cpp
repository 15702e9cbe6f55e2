// The Qwen3-VL vision tower (Qwen3VLVisionModel): frozen (no autograd), or with LoRA on the linear layers that
// lora.vision_targets name (models/vision_lora.hpp).
//
// Patches arrive flattened [N, C·T·P·P] in the processor's order (per image, 2x2 merge blocks in raster order,
// the four patches of a block together) and keep it: every block attends over a whole image frame. The patch
// embedding (a Conv3d with bias, stride = kernel: a matmul) is added to the learned position table resampled
// to the image's grid (bilinear, align_corners); the blocks are pre-LayerNorm with a 2-D rotary and a GELU
// MLP. After the blocks listed in deepstack_visual_indexes a merger of their own (LayerNorm over the four
// patches side by side) makes the deepstack features; the last block's output goes through the main merger
// (LayerNorm per patch, then the four side by side).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "ops/check.hpp"
#include "models/qwen3_vl.hpp"

namespace ax::models {

std::pair<at::Tensor, at::Tensor> position_taps(const Grids& grids, int64_t merge, int64_t side) {
  at::Tensor hw = patch_hw(grids, merge);
  const int64_t N = hw.size(0);
  at::Tensor idx = at::empty({N, 4}, at::kLong), wt = at::empty({N, 4}, at::kFloat);
  const int64_t* p = hw.data_ptr<int64_t>();
  int64_t* ip = idx.data_ptr<int64_t>();
  float* wp = wt.data_ptr<float>();
  // One axis as _interpolation_axis_taps_weights computes it in fp32: src = i·(side-1) / max(size-1, 1),
  // taps floor and floor+1 clamped to the table, weights 1 - |src - tap| (before the clamp) floored at 0.
  auto axis = [side](int64_t i, int64_t size, int64_t tap[2], float w[2]) {
    const float src = static_cast<float>(i) * static_cast<float>(side - 1) / static_cast<float>(std::max<int64_t>(size - 1, 1));
    const float fl = std::floor(src);
    for (int o = 0; o < 2; ++o) {
      tap[o] = std::clamp<int64_t>(static_cast<int64_t>(fl) + o, 0, side - 1);
      w[o] = std::max(0.0f, 1.0f - std::fabs(src - fl - static_cast<float>(o)));
    }
  };
  int64_t k = 0;
  for (const auto& [t, h, w] : grids)
    for (int64_t n = 0; n < t * h * w; ++n, ++k) {
      int64_t th[2], tw[2];
      float wh[2], ww[2];
      axis(p[2 * k], h, th, wh);
      axis(p[2 * k + 1], w, tw, ww);
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          ip[4 * k + 2 * a + b] = th[a] * side + tw[b];
          wp[4 * k + 2 * a + b] = wh[a] * ww[b];
        }
    }
  return {idx, wt};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> qwen3_vision_tensors(const Qwen3VisionConfig& v) {
  const int64_t C = v.hidden_size, I = v.intermediate_size, M = C * v.merge_unit();
  std::vector<std::pair<std::string, std::vector<int64_t>>> want{
      {"patch_embed.proj.weight", {C, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size}},
      {"patch_embed.proj.bias", {C}},
      {"pos_embed.weight", {v.num_position_embeddings, C}}};
  for (int64_t i = 0; i < v.depth; ++i) {
    const std::string p = str("blocks.", i, ".");
    for (auto& e : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"norm1.weight", {C}}, {"norm1.bias", {C}}, {"norm2.weight", {C}}, {"norm2.bias", {C}},
             {"attn.qkv.weight", {3 * C, C}}, {"attn.qkv.bias", {3 * C}}, {"attn.proj.weight", {C, C}}, {"attn.proj.bias", {C}},
             {"mlp.linear_fc1.weight", {I, C}}, {"mlp.linear_fc1.bias", {I}}, {"mlp.linear_fc2.weight", {C, I}},
             {"mlp.linear_fc2.bias", {C}}})
      want.push_back({p + e.first, e.second});
  }
  auto merger = [&](const std::string& p, int64_t norm) {
    for (auto& e : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"norm.weight", {norm}}, {"norm.bias", {norm}}, {"linear_fc1.weight", {M, M}}, {"linear_fc1.bias", {M}},
             {"linear_fc2.weight", {v.out_hidden_size, M}}, {"linear_fc2.bias", {v.out_hidden_size}}})
      want.push_back({p + e.first, e.second});
  };
  merger("merger.", C);
  for (std::size_t k = 0; k < v.deepstack_visual_indexes.size(); ++k) merger(str("deepstack_merger_list.", k, "."), M);
  return want;
}

void check_qwen3_vision_checkpoint(const Qwen3VisionConfig& v, const safetensors::Checkpoint& ckpt, const std::string& prefix) {
  VisionConfig blocks;  // check_vision_blocks reads the depth only
  blocks.depth = v.depth;
  check_vision_blocks(blocks, ckpt, prefix);
  for (const auto& [name, shape] : qwen3_vision_tensors(v)) {
    const std::string key = prefix + name;
    const auto& info = ckpt.info(key);  // throws naming the checkpoint and tensor
    if (info.shape != shape)
      throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has shape ", ops::check::shape_str(info.shape), " but the vision config implies ",
                           ops::check::shape_str(shape)));
    if (!at::isFloatingType(info.scalar_type)) throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has non-float dtype ", info.dtype));
  }
}

std::vector<OpCall> Qwen3VisionTower::calls() { return {{"attention", "", ""}}; }

Qwen3VisionTower::Qwen3VisionTower(const Qwen3VisionConfig& cfg, const safetensors::Checkpoint& ckpt, const std::string& prefix,
                                   at::ScalarType dtype, at::Device device, std::shared_ptr<KernelSet> kernels)
    : cfg_(cfg), prefix_(prefix), dtype_(dtype), device_(device), kernels_(std::move(kernels)) {
  check_qwen3_vision_checkpoint(cfg_, ckpt, prefix);
  for (const auto& [name, shape] : qwen3_vision_tensors(cfg_)) {
    const std::string key = prefix + name;
    at::Tensor t = ckpt.get(key).to(device_, dtype_);
    used_.push_back(key);
    named_.emplace_back(key, t);
    // The Conv3d with stride = kernel over exactly one patch is a matmul with the flattened kernel.
    weights_[name] = name == "patch_embed.proj.weight" ? t.reshape({cfg_.hidden_size, -1}) : t;
  }
  for (const auto& c : calls()) kernels_->get_backend(c.op, ops::dtype_name(dtype_), c.format, c.layout);
}

const at::Tensor& Qwen3VisionTower::w(const std::string& name) const {
  auto it = weights_.find(name);
  if (it == weights_.end()) throw RuntimeError(str("qwen3_vl vision tower has no weight '", name, "'"));
  return it->second;
}

at::Tensor Qwen3VisionTower::linear(const at::Tensor& x, const std::string& module) const {
  if (lora_) return lora_->linear(x, w(module + ".weight"), w(module + ".bias"), prefix_ + module);
  return at::linear(x, w(module + ".weight"), w(module + ".bias"));
}

at::Tensor Qwen3VisionTower::layer_norm(const at::Tensor& x, const std::string& module) const {
  return at::layer_norm(x, {x.size(-1)}, w(module + ".weight"), w(module + ".bias"), 1e-6);
}

at::Tensor Qwen3VisionTower::merger(const at::Tensor& x, const std::string& module, bool postshuffle_norm) const {
  const int64_t M = cfg_.hidden_size * cfg_.merge_unit();
  at::Tensor m = postshuffle_norm ? layer_norm(x.reshape({-1, M}), module + "norm") : layer_norm(x, module + "norm").reshape({-1, M});
  return linear(at::gelu(linear(m, module + "linear_fc1")), module + "linear_fc2");
}

at::Tensor Qwen3VisionTower::block(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                   const at::Tensor& cu, int64_t max_len) const {
  const std::string p = str("blocks.", i, ".");
  if (!attention_) attention_ = attention_chain_of(*kernels_, dtype_, "");
  // Every patch of an image frame attends to every other (qwen2_5_vl.hpp: the two towers' shared attention).
  at::Tensor o = vision_rotary_attention(attention_, linear(layer_norm(x, p + "norm1"), p + "attn.qkv"), cfg_.num_heads,
                                         cos, sin, cu, max_len);
  at::Tensor h = x + linear(o, p + "attn.proj");
  at::Tensor mid = linear(layer_norm(h, p + "norm2"), p + "mlp.linear_fc1");
  mid = cfg_.hidden_act == "gelu" ? at::gelu(mid) : at::gelu(mid, "tanh");
  return h + linear(mid, p + "mlp.linear_fc2");
}

Qwen3VisionTower::Features Qwen3VisionTower::forward(const at::Tensor& pixel_values, const Grids& grids) const {
  std::optional<at::NoGradGuard> no_grad;  // frozen: nothing here requires grad, and no graph is kept
  if (!lora_ || lora_->empty()) no_grad.emplace();
  int64_t N = 0;
  for (const auto& [t, h, w] : grids) N += t * h * w;
  if (pixel_values.dim() != 2 || pixel_values.size(0) != N || pixel_values.size(1) != cfg_.patch_dim())
    throw UsageError(str("qwen3_vl: extras[\"pixel_values\"] is ", ops::check::shape_str(pixel_values.sizes().vec()), " but image_grid_thw gives ", N,
                         " patches of ", cfg_.patch_dim(), " values"));
  if (!at::isFloatingType(pixel_values.scalar_type())) throw UsageError("qwen3_vl: extras[\"pixel_values\"] must be a float tensor");
  const int64_t D = cfg_.head_dim();
  at::Tensor x = linear(pixel_values.to(device_, dtype_), "patch_embed.proj");  // [N, C]
  auto [tap_idx, tap_w] = position_taps(grids, cfg_.spatial_merge_size, cfg_.grid_side());
  at::Tensor taps = w("pos_embed.weight").index_select(0, to_device_async(tap_idx.view({-1}), device_)).view({N, 4, -1});
  x = x + (taps * to_device_async(tap_w, device_).to(dtype_).unsqueeze(-1)).sum(1);
  // 2-D rotary (qwen2_5_vl.hpp's, as Qwen3VLVisionRotaryEmbedding computes it).
  at::Tensor ang = vision_rope_angles(grids, cfg_.spatial_merge_size, D, cfg_.rope_theta, device_).unsqueeze(1);  // [N, 1, D]
  at::Tensor cos = ang.cos(), sin = ang.sin();
  // Attention spans: one per image frame.
  std::vector<int32_t> cu{0};
  int64_t max_len = 0;
  for (const auto& [t, h, w] : grids)
    for (int64_t f = 0; f < t; ++f) {
      cu.push_back(static_cast<int32_t>(cu.back() + h * w));
      max_len = std::max(max_len, h * w);
    }
  at::Tensor cu_t = to_device_async(at::tensor(cu, at::kInt), device_);
  Features out;
  const auto& ds = cfg_.deepstack_visual_indexes;
  for (int64_t i = 0; i < cfg_.depth; ++i) {
    x = block(i, x, cos, sin, cu_t, max_len);
    // Block i's deepstack feature goes through the merger at i's place in the list; features in block order.
    if (auto it = std::find(ds.begin(), ds.end(), i); it != ds.end())
      out.deepstack.push_back(merger(x, str("deepstack_merger_list.", it - ds.begin(), "."), true));
  }
  out.merged = merger(x, "merger.", false);
  return out;
}

}  // namespace ax::models
