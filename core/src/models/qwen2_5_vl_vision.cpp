// The Qwen2.5-VL vision tower (Qwen2_5_VisionTransformerPretrainedModel), frozen: no LoRA, no autograd.
//
// Patches arrive flattened [N, C·T·P·P] in the processor's order: per image, 2x2 merge blocks in raster order,
// the four patches of a block together. The tower reorders whole merge blocks into windows (window_size pixels
// square, get_vision_window_index), runs blocks with windowed attention (full attention over each image frame
// at fullatt_block_indexes), merges each block's four patches into one token and restores the image order.
#include <algorithm>
#include <cctype>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/qwen2_5_vl.hpp"

namespace ax::models {

namespace {

std::string dims(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}

// get_vision_window_index: merge blocks regrouped window by window (windows of window_size / merge / patch
// blocks a side, row-major, per frame), and the windows' cumulative lengths in patches. Empty windows vanish
// (transformers' unique_consecutive).
std::pair<std::vector<int64_t>, std::vector<int32_t>> window_index(const Grids& grids, const VisionConfig& v) {
  const int64_t m = v.spatial_merge_size, win = v.window_size / m / v.patch_size, unit = v.merge_unit();
  std::vector<int64_t> index;
  std::vector<int32_t> cu{0};
  int64_t base = 0;
  for (const auto& [t, h, w] : grids) {
    const int64_t lh = h / m, lw = w / m;
    for (int64_t f = 0; f < t; ++f)
      for (int64_t wy = 0; wy * win < lh; ++wy)
        for (int64_t wx = 0; wx * win < lw; ++wx) {
          int64_t n = 0;
          for (int64_t y = wy * win; y < std::min(lh, (wy + 1) * win); ++y)
            for (int64_t x = wx * win; x < std::min(lw, (wx + 1) * win); ++x, ++n) index.push_back(base + (f * lh + y) * lw + x);
          if (n > 0) cu.push_back(static_cast<int32_t>(cu.back() + n * unit));
        }
    base += t * lh * lw;
  }
  return {index, cu};
}

// Reorders [N, ...] by whole merge blocks: row block i of the result is block index[i] of x.
at::Tensor permute_blocks(const at::Tensor& x, const at::Tensor& index, int64_t unit) {
  const int64_t n = x.size(0);
  return x.reshape({n / unit, unit, -1}).index_select(0, index).reshape({n, -1});
}

// The MLP weights with the intermediate size I padded to a multiple of 8: gate/up rows (and biases), down columns.
at::Tensor pad_intermediate(const std::string& name, const at::Tensor& t, int64_t I) {
  const int64_t padded = (I + 7) / 8 * 8;
  if (padded == I) return t;
  const bool rows = name.find("mlp.gate_proj.") != std::string::npos || name.find("mlp.up_proj.") != std::string::npos;
  const bool cols = name.find("mlp.down_proj.weight") != std::string::npos;
  if (!rows && !cols) return t;
  const int64_t dim = rows ? 0 : 1;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = padded;
  at::Tensor out = at::zeros(shape, t.options());
  out.narrow(dim, 0, I).copy_(t);
  return out;
}

// The checkpoint's view of a padded weight (what named_parameters reports): no copy.
at::Tensor unpadded(const std::string& name, const at::Tensor& t, int64_t I) {
  return name.find("mlp.down_proj.weight") != std::string::npos ? t.narrow(1, 0, I) : t.narrow(0, 0, I);
}

}  // namespace

at::Tensor patch_hw(const Grids& grids, int64_t merge) {
  std::vector<int64_t> out;
  for (const auto& [t, h, w] : grids)
    for (int64_t f = 0; f < t; ++f)
      for (int64_t bh = 0; bh < h / merge; ++bh)
        for (int64_t bw = 0; bw < w / merge; ++bw)
          for (int64_t ih = 0; ih < merge; ++ih)
            for (int64_t iw = 0; iw < merge; ++iw) {
              out.push_back(bh * merge + ih);
              out.push_back(bw * merge + iw);
            }
  return at::tensor(out, at::kLong).view({-1, 2});
}

at::Tensor vision_rope_angles(const Grids& grids, int64_t merge, int64_t D, double theta, at::Device device) {
  at::Tensor inv = 1.0 / at::pow(theta, at::arange(0, D / 2, 2, at::kFloat) / double(D / 2));
  at::Tensor hw = to_device_async(patch_hw(grids, merge), device);
  at::Tensor f = hw.to(at::kFloat).unsqueeze(-1) * to_device_async(inv, device).view({1, 1, -1});  // [N, 2, D/4]
  at::Tensor ang = f.reshape({f.size(0), -1});
  return at::cat({ang, ang}, -1);
}

at::Tensor vision_rotary_attention(const std::shared_ptr<ops::Attention>& attention, const at::Tensor& qkv, int64_t H,
                                   const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cu, int64_t max_len) {
  const int64_t N = qkv.size(0), D = qkv.size(1) / (3 * H);
  const at::Tensor heads = qkv.view({N, 3, H, D});
  auto rot = [&](const at::Tensor& t) {
    at::Tensor f = t.to(at::kFloat);
    at::Tensor rh = at::cat({-f.narrow(-1, D / 2, D / 2), f.narrow(-1, 0, D / 2)}, -1);
    return (f * cos + rh * sin).to(t.scalar_type());
  };
  ops::AttentionArgs a;
  a.q = rot(heads.select(1, 0)).contiguous();
  a.k = rot(heads.select(1, 1)).contiguous();
  a.v = heads.select(1, 2).contiguous();
  a.cu_seqlens = cu;
  a.max_seqlen = max_len;
  a.softmax_scale = 1.0 / std::sqrt(double(D));
  a.causal = false;  // every patch of a span sees every other
  a.check_values = false;  // built by the tower
  return autograd::attention(attention, std::move(a)).reshape({N, H * D});
}

Grids read_grids(const at::Tensor& g, const VisionConfig& v) { return read_grids(g, v.spatial_merge_size, "qwen2_5_vl"); }

Grids read_grids(const at::Tensor& g, int64_t merge, const std::string& family) {
  if (!g.defined() || g.dim() != 2 || g.size(1) != 3)
    throw UsageError(str(family, ": extras[\"image_grid_thw\"] must be [n_images, 3], got ", g.defined() ? dims(g.sizes().vec()) : "none"));
  if (at::isFloatingType(g.scalar_type())) throw UsageError(str(family, ": extras[\"image_grid_thw\"] must be an integer tensor"));
  at::Tensor h = g.to(at::kCPU, at::kLong).contiguous();
  Grids out;
  const int64_t* p = h.data_ptr<int64_t>();
  for (int64_t i = 0; i < h.size(0); ++i) {
    std::array<int64_t, 3> thw{p[3 * i], p[3 * i + 1], p[3 * i + 2]};
    // Bounded so that patch counts stay far from int64 limits (a 2^15-patch side is ~460k pixels).
    for (int64_t d : thw)
      if (d <= 0 || d > (int64_t(1) << 15))
        throw UsageError(str(family, ": image ", i, " has grid_thw [", thw[0], ", ", thw[1], ", ", thw[2], "]: each must be in [1, 32768]"));
    if (thw[1] % merge || thw[2] % merge)
      throw UsageError(str(family, ": image ", i, " has grid h, w = ", thw[1], ", ", thw[2], ", not multiples of spatial_merge_size ", merge));
    out.push_back(thw);
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> vision_checkpoint_tensors(const VisionConfig& v) {
  const int64_t C = v.hidden_size, I = v.intermediate_size, M = C * v.merge_unit();
  std::vector<std::pair<std::string, std::vector<int64_t>>> want{
      {"patch_embed.proj.weight", {C, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size}}};
  for (int64_t i = 0; i < v.depth; ++i) {
    const std::string p = str("blocks.", i, ".");
    for (auto& e : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"norm1.weight", {C}}, {"norm2.weight", {C}}, {"attn.qkv.weight", {3 * C, C}}, {"attn.qkv.bias", {3 * C}},
             {"attn.proj.weight", {C, C}}, {"attn.proj.bias", {C}}, {"mlp.gate_proj.weight", {I, C}}, {"mlp.gate_proj.bias", {I}},
             {"mlp.up_proj.weight", {I, C}}, {"mlp.up_proj.bias", {I}}, {"mlp.down_proj.weight", {C, I}}, {"mlp.down_proj.bias", {C}}})
      want.push_back({p + e.first, e.second});
  }
  for (auto& e : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"merger.ln_q.weight", {C}}, {"merger.mlp.0.weight", {M, M}}, {"merger.mlp.0.bias", {M}},
           {"merger.mlp.2.weight", {v.out_hidden_size, M}}, {"merger.mlp.2.bias", {v.out_hidden_size}}})
    want.push_back(e);
  return want;
}

void check_vision_blocks(const VisionConfig& v, const safetensors::Checkpoint& ckpt, const std::string& prefix) {
  // One past the highest index under <prefix>blocks.<i>. (a gap is a missing tensor, found by the tensor check).
  int64_t present = 0;
  const std::string head = prefix + "blocks.";
  for (const auto& n : ckpt.names()) {
    if (n.compare(0, head.size(), head) != 0) continue;
    std::size_t k = head.size();
    int64_t i = 0;
    while (k < n.size() && std::isdigit(static_cast<unsigned char>(n[k])) && i < (int64_t(1) << 40)) i = i * 10 + (n[k++] - '0');
    if (k > head.size() && k < n.size() && n[k] == '.') present = std::max(present, i + 1);
  }
  if (v.depth > present)
    throw UsageError(str("'vision_config.depth' is ", v.depth, " but ", ckpt.source(), " holds ",
                         present == 0 ? str("no vision block (no tensor under ", head, ")")
                                      : str("vision blocks 0 to ", present - 1, " only (no tensor under ", head, present, ".)")));
}

void check_vision_checkpoint(const VisionConfig& v, const safetensors::Checkpoint& ckpt, const std::string& prefix) {
  check_vision_blocks(v, ckpt, prefix);
  for (const auto& [name, shape] : vision_checkpoint_tensors(v)) {
    const std::string key = prefix + name;
    const auto& info = ckpt.info(key);  // throws naming the checkpoint and tensor
    if (info.shape != shape)
      throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has shape ", dims(info.shape), " but the vision config implies ", dims(shape)));
    if (!at::isFloatingType(info.scalar_type)) throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has non-float dtype ", info.dtype));
  }
}

std::vector<OpCall> VisionTower::calls() {
  return {{"attention", "", ""}, {"linear.lora", "dense", ""}, {"rms_norm", "", ""}, {"swiglu", "", ""}};
}

VisionTower::VisionTower(const VisionConfig& cfg, const safetensors::Checkpoint& ckpt, const std::string& prefix,
                         at::ScalarType dtype, at::Device device, std::shared_ptr<KernelSet> kernels)
    : cfg_(cfg), dtype_(dtype), device_(device), kernels_(std::move(kernels)) {
  check_vision_checkpoint(cfg_, ckpt, prefix);
  for (const auto& [name, shape] : vision_checkpoint_tensors(cfg_)) {
    const std::string key = prefix + name;
    at::Tensor t = ckpt.get(key).to(device_, dtype_);
    used_.push_back(key);
    // The Conv3d with stride = kernel over exactly one patch is a matmul with the flattened kernel.
    at::Tensor use = name == "patch_embed.proj.weight" ? t.reshape({cfg_.hidden_size, -1}) : t;
    // On CUDA the MLP's intermediate size is padded with zeros to a multiple of 8 (Qwen2.5-VL's 3420 is not):
    // cuBLAS runs 16-byte-aligned operands on its sm90 kernels, while 3420 leaves it sm80 kernels at ~40% of
    // the rate (measured: bench/mm_cpt). Zero gate/up rows and biases give SiLU(0)·0 = 0 and zero down columns
    // add nothing, so the result is the same; the CPU keeps the checkpoint's shapes (parity tests: same bits).
    at::Tensor padded = device_.is_cuda() ? pad_intermediate(name, use, cfg_.intermediate_size) : use;
    named_.emplace_back(key, padded.is_same(use) ? t : unpadded(name, padded, cfg_.intermediate_size));
    weights_[name] = padded;
  }
  for (const auto& c : calls()) kernels_->get_backend(c.op, ops::dtype_name(dtype_), c.format, c.layout);
}

const at::Tensor& VisionTower::w(const std::string& name) const {
  auto it = weights_.find(name);
  if (it == weights_.end()) throw RuntimeError(str("vision tower has no weight '", name, "'"));
  return it->second;
}

at::Tensor VisionTower::linear(const at::Tensor& x, const std::string& module) const {
  ops::LinearLoraArgs a;
  a.x = x;
  a.weight = ops::WeightTensor::dense(w(module + ".weight"));
  a.bias = w(module + ".bias");
  return autograd::linear_lora(kernels_->get<ops::LinearLora>(ops::dtype_name(dtype_), "dense"), std::move(a));
}

at::Tensor VisionTower::rms_norm(const at::Tensor& x, const std::string& weight) const {
  ops::RmsNormArgs a;  // Qwen2_5_VLRMSNorm, eps 1e-6 everywhere in the tower
  a.x = x;
  a.weight = w(weight);
  a.eps = 1e-6;
  return autograd::rms_norm(kernels_->get<ops::RmsNorm>(ops::dtype_name(dtype_)), std::move(a)).y;
}

at::Tensor VisionTower::block(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              const at::Tensor& cu, int64_t max_len) const {
  const std::string p = str("blocks.", i, ".");
  if (!attention_) attention_ = attention_chain_of(*kernels_, dtype_, "");
  // Each window (an image frame, in the full-attention blocks) attends within itself.
  at::Tensor o = vision_rotary_attention(attention_, linear(rms_norm(x, p + "norm1.weight"), p + "attn.qkv"), cfg_.num_heads,
                                         cos, sin, cu, max_len);
  at::Tensor h = x + linear(o, p + "attn.proj");
  at::Tensor n = rms_norm(h, p + "norm2.weight");
  ops::SwigluArgs sw;
  sw.gate = linear(n, p + "mlp.gate_proj");
  sw.up = linear(n, p + "mlp.up_proj");
  at::Tensor act = autograd::swiglu(kernels_->get<ops::Swiglu>(ops::dtype_name(dtype_)), std::move(sw));
  return h + linear(act, p + "mlp.down_proj");
}

at::Tensor VisionTower::forward(const at::Tensor& pixel_values, const Grids& grids) const {
  at::NoGradGuard no_grad;  // frozen: nothing here requires grad, and no graph is kept
  int64_t N = 0;
  for (const auto& [t, h, w] : grids) N += t * h * w;
  if (pixel_values.dim() != 2 || pixel_values.size(0) != N || pixel_values.size(1) != cfg_.patch_dim())
    throw UsageError(str("qwen2_5_vl: extras[\"pixel_values\"] is ", dims(pixel_values.sizes().vec()), " but image_grid_thw gives ", N,
                         " patches of ", cfg_.patch_dim(), " values"));
  if (!at::isFloatingType(pixel_values.scalar_type())) throw UsageError("qwen2_5_vl: extras[\"pixel_values\"] must be a float tensor");
  const int64_t unit = cfg_.merge_unit(), D = cfg_.head_dim();
  auto [widx, wcu] = window_index(grids, cfg_);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device_);
  at::Tensor index = to_device_async(at::tensor(widx, at::kLong), device_);
  at::Tensor x = at::matmul(pixel_values.to(device_, dtype_), w("patch_embed.proj.weight").t());  // [N, C]
  x = permute_blocks(x, index, unit);
  // 2-D rotary, in the window order.
  at::Tensor ang = vision_rope_angles(grids, cfg_.spatial_merge_size, D, cfg_.rope_theta, device_);
  ang = permute_blocks(ang, index, unit).unsqueeze(1);  // [N, 1, D]
  at::Tensor cos = ang.cos(), sin = ang.sin();
  // Full attention: one span per image frame; windows: wcu.
  std::vector<int32_t> full{0};
  int64_t max_full = 0, max_win = 0;
  for (const auto& [t, h, w] : grids)
    for (int64_t k = 0; k < t; ++k) {
      full.push_back(static_cast<int32_t>(full.back() + h * w));
      max_full = std::max(max_full, h * w);
    }
  for (std::size_t k = 1; k < wcu.size(); ++k) max_win = std::max<int64_t>(max_win, wcu[k] - wcu[k - 1]);
  at::Tensor cu_full = to_device_async(at::tensor(full, at::kInt), device_), cu_win = to_device_async(at::tensor(wcu, at::kInt), device_);
  for (int64_t i = 0; i < cfg_.depth; ++i) {
    bool is_full = std::find(cfg_.fullatt_block_indexes.begin(), cfg_.fullatt_block_indexes.end(), i) != cfg_.fullatt_block_indexes.end();
    x = block(i, x, cos, sin, is_full ? cu_full : cu_win, is_full ? max_full : max_win);
  }
  // Patch merger: RMSNorm, each block's four patches side by side, Linear-GELU(erf)-Linear.
  at::Tensor m = rms_norm(x, "merger.ln_q.weight").reshape({N / unit, -1});
  m = linear(at::gelu(linear(m, "merger.mlp.0")), "merger.mlp.2");
  // Back to the image order: the inverse of the window permutation.
  at::Tensor inverse = at::empty_like(index);
  inverse.index_put_({index}, at::arange(index.size(0), long_opts));
  return m.index_select(0, inverse);
}

}  // namespace ax::models
