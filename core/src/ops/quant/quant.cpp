// The weight formats in code. Every quantiser replays the peer's algorithm op for op (same ATen ops in
// the same order, so the same fp32 roundings): bitsandbytes' CPU/default quantize_4bit and
// quantize_blockwise, torchao's to_mx (FLOOR) and nvfp4_quantize. tests/data/quant/ pins them.
#include "axengine/ops/quant.hpp"
#include "axengine/ops/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/ops/quantizer.hpp"
#include "axengine/strings.hpp"
#include "ops/check.hpp"

namespace ax::ops {

const std::array<float, 16>& nf4_values() {
  // bitsandbytes functional.get_4bit_type("nf4") (normal-float quantiles, Dettmers et al. 2023)
  static const std::array<float, 16> v = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
      0.7229568362236023f, 1.0f};
  return v;
}

const std::array<float, 16>& e2m1_values() {
  static const std::array<float, 16> v = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return v;
}

at::Tensor bnb_dynamic_map() {
  // functional.create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), with the same ATen
  // ops so the fp32 values agree exactly: for exponent i, the midpoints of linspace(0.1, 1, 2^i + 1)
  // scaled by ±10^(i-6); then 0 and 1; sorted.
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = (int64_t{1} << i) + 1;
    at::Tensor b = at::linspace(0.1, 1, items, at::TensorOptions().dtype(at::kFloat));
    at::Tensor means = (b.slice(0, 0, items - 1) + b.slice(0, 1, items)) / 2.0;
    const double scale = std::pow(10.0, -6 + i);
    for (at::Tensor part : {means * scale, means * (-scale)}) {
      auto acc = part.contiguous();
      for (int64_t j = 0; j < acc.numel(); ++j) data.push_back(acc.data_ptr<float>()[j]);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  std::sort(data.begin(), data.end());
  at::Tensor out = at::empty({256}, at::kFloat);
  for (int64_t j = 0; j < 256; ++j) out.data_ptr<float>()[j] = static_cast<float>(data[static_cast<size_t>(j)]);
  return out;
}

at::Tensor pack_nibbles(const at::Tensor& codes, bool first_high) {
  TORCH_CHECK(codes.dim() >= 1 && codes.size(-1) % 2 == 0, "pack_nibbles: last dim must be even");
  at::Tensor c = codes.to(at::kByte).reshape({-1, 2});
  at::Tensor a = c.select(1, 0), b = c.select(1, 1);
  at::Tensor packed = first_high ? at::bitwise_or(at::bitwise_left_shift(a, 4), b)
                                 : at::bitwise_or(a, at::bitwise_left_shift(b, 4));
  auto shape = codes.sizes().vec();
  shape.back() /= 2;
  return packed.reshape(shape);
}

at::Tensor unpack_nibbles(const at::Tensor& packed, bool first_high) {
  at::Tensor hi = at::bitwise_right_shift(packed, 4);
  at::Tensor lo = at::bitwise_and(packed, 15);
  at::Tensor both = first_high ? at::stack({hi, lo}, -1) : at::stack({lo, hi}, -1);
  auto shape = packed.sizes().vec();
  if (shape.empty()) shape.push_back(1);
  shape.back() *= 2;
  return both.reshape(shape);
}

at::Tensor e2m1_encode(const at::Tensor& x) {
  // Round to nearest, ties to the even code (0, 1.0, 2.0, 4.0 have even codes), saturate at 6.
  at::Tensor a = x.to(at::kFloat).abs();
  at::Tensor code = (a > 0.25).to(at::kByte) + (a >= 0.75).to(at::kByte) + (a > 1.25).to(at::kByte) +
                    (a >= 1.75).to(at::kByte) + (a > 2.5).to(at::kByte) + (a >= 3.5).to(at::kByte) +
                    (a > 5.0).to(at::kByte);
  return at::bitwise_or(code, at::bitwise_left_shift(at::signbit(x).to(at::kByte), 3));
}

namespace {
// A code table on `device`, made once per (table, device) and kept: a host-to-device copy on every call
// would make each dequantising call uncapturable in a CUDA graph (the first, eager call makes it).
at::Tensor table(const std::array<float, 16>& values, const at::Device& device) {
  static std::mutex mutex;
  static std::map<std::pair<const float*, std::string>, at::Tensor> made;
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& t = made[{values.data(), device.str()}];
  if (!t.defined()) t = at::tensor(at::ArrayRef<float>(values.data(), values.size()), at::kFloat).to(device);
  return t;
}
}  // namespace

at::Tensor e2m1_decode(const at::Tensor& codes) {
  return table(e2m1_values(), codes.device()).index({codes.to(at::kLong)});
}

at::Tensor e8m0_decode(const at::Tensor& scales) {
  // 2^(s-127) built from the fp32 bit pattern: s in the exponent field; s == 0 is the denormal 2^-127
  // (bit 22 set) and s == 255 is NaN.
  at::Tensor s = scales.to(at::kInt);
  at::Tensor bits = at::where(s == 0, at::full({}, 0x00400000, s.options()), at::bitwise_left_shift(s, 23));
  at::Tensor v = bits.view(at::kFloat);
  return at::where(s == 255, at::full({}, NAN, v.options()), v);
}

at::Tensor e4m3_decode(const at::Tensor& scales) {
  if (scales.scalar_type() == at::kByte) return scales.view(at::kFloat8_e4m3fn).to(at::kFloat);
  return scales.to(at::kFloat);
}

namespace {

void check_quant_input(const at::Tensor& w, const char* fn) {
  if (!w.defined()) throw UsageError(str(fn, ": w: is required but was not given"));
  const auto dt = w.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf && dt != at::kDouble)
    throw UsageError(str(fn, ": w: must be fp32, bf16 or fp16, got ", check::dtype_str(dt)));
  if (w.numel() == 0) throw UsageError(str(fn, ": w: is empty"));
}

int64_t norm_axis(int64_t axis, int64_t dim, const char* fn) {
  const int64_t a = axis < 0 ? axis + dim : axis;
  if (a < 0 || a >= dim) throw UsageError(str(fn, ": axis: ", axis, " is outside a ", dim, "-dim tensor"));
  return a;
}

// bitsandbytes' blockwise nearest-code quantisation of a flat fp32 tensor (n % blocksize == 0):
// absmax per block, x·(1/absmax) clamped to [-1, 1], nearest value of the sorted `code` (a value exactly
// between two codes goes to the lower one, as torch.bucketize on the midpoints does).
std::pair<at::Tensor, at::Tensor> blockwise_nearest(const at::Tensor& flat, const at::Tensor& code, int64_t bs) {
  at::Tensor blocks = flat.reshape({-1, bs});
  at::Tensor absmax = std::get<0>(blocks.abs().max(1));
  at::Tensor scaled = at::clamp(blocks * at::reciprocal(absmax.clamp_min(1e-38)).unsqueeze(1), -1, 1).reshape(-1);
  const int64_t nc = code.numel();
  at::Tensor bounds = (code.slice(0, 0, nc - 1) + code.slice(0, 1, nc)) / 2;
  at::Tensor q = at::bucketize(scaled, bounds, /*out_int32=*/true).to(at::kByte);
  return {q, absmax};
}

}  // namespace

WeightTensor quantize_nf4(const at::Tensor& w, int64_t blocksize, bool double_quant) {
  check_quant_input(w, "quantize_nf4");
  if (blocksize < 16 || blocksize > 4096 || (blocksize & (blocksize - 1)) != 0)
    throw UsageError(str("quantize_nf4: blocksize must be a power of two in 16..4096, got ", blocksize));
  if (w.numel() % blocksize != 0)
    throw UsageError(str("quantize_nf4: w: ", w.numel(), " elements are not a multiple of blocksize ", blocksize));
  at::Tensor flat = w.reshape(-1).to(at::kFloat);
  auto [q, absmax] = blockwise_nearest(flat, table(nf4_values(), w.device()), blocksize);

  WeightTensor out;
  out.format = WeightFormat::nf4;
  out.shape = w.sizes().vec();
  out.blocksize = blocksize;
  out.codes = pack_nibbles(q, /*first_high=*/true);
  if (!double_quant) {
    out.scales = absmax;
    return out;
  }
  // bitsandbytes compress_statistics: offset = mean(absmax), quantize_blockwise(absmax - offset, 256)
  // with the signed dynamic map. A trailing partial block of absmax is quantised on its own.
  at::Tensor offset = absmax.mean();
  at::Tensor centered = absmax - offset;
  at::Tensor code = bnb_dynamic_map().to(w.device());
  const int64_t nb = centered.numel(), nbs = 256, full = nb - nb % nbs;
  std::vector<at::Tensor> qs, ms;
  if (full > 0) {
    auto [q1, m1] = blockwise_nearest(centered.slice(0, 0, full), code, nbs);
    qs.push_back(q1);
    ms.push_back(m1);
  }
  if (full < nb) {
    auto [q2, m2] = blockwise_nearest(centered.slice(0, full, nb), code, nb - full);
    qs.push_back(q2);
    ms.push_back(m2);
  }
  out.scales = at::cat(qs);
  out.nested_scales = at::cat(ms);
  out.nested_code = code;
  out.nested_offset = offset.item<float>();
  out.nested_blocksize = nbs;
  return out;
}

WeightTensor quantize_mxfp4(const at::Tensor& w, int64_t axis) {
  check_quant_input(w, "quantize_mxfp4");
  const int64_t a = norm_axis(axis, w.dim(), "quantize_mxfp4");
  if (w.size(a) % 32 != 0)
    throw UsageError(str("quantize_mxfp4: w: dim ", a, " is ", w.size(a), ", not a multiple of 32"));
  // torchao to_mx, scaling_mode FLOOR: the scale is 2^(floor(log2(amax)) - 2) (2 = log2 of E2M1's largest
  // power of two, 4), read from amax's fp32 exponent field and clamped to E8M0's range.
  at::Tensor x = w.movedim(a, -1).contiguous();
  auto lead = x.sizes().vec();
  const int64_t K = lead.back();
  lead.pop_back();
  std::vector<int64_t> blk = lead;
  blk.push_back(K / 32);
  blk.push_back(32);
  at::Tensor b = x.reshape(blk);
  at::Tensor amax = at::amax(b.abs(), {-1}, /*keepdim=*/true).to(at::kFloat);
  b = b.to(at::kFloat);
  at::Tensor pow2 = at::bitwise_and(at::bitwise_right_shift(amax.view(at::kInt), 23), 0xFF) - 127;
  at::Tensor unbiased = at::clamp(pow2 - 2, -127, 128);
  at::Tensor biased = (unbiased + 127).to(at::kByte);
  at::Tensor scale = at::clamp_min(at::bitwise_left_shift(biased.to(at::kInt), 23).view(at::kFloat),
                                   std::numeric_limits<float>::min());
  at::Tensor codes = e2m1_encode((b / scale).reshape(x.sizes()));

  WeightTensor out;
  out.format = WeightFormat::mxfp4;
  out.shape = w.sizes().vec();
  out.blocksize = 32;
  out.axis = a;
  out.codes = pack_nibbles(codes, /*first_high=*/false).movedim(-1, a).contiguous();
  out.scales = biased.squeeze(-1).movedim(-1, a).contiguous();
  return out;
}

WeightTensor quantize_nvfp4(const at::Tensor& w, int64_t axis, bool per_expert_global_scale) {
  check_quant_input(w, "quantize_nvfp4");
  const int64_t a = norm_axis(axis, w.dim(), "quantize_nvfp4");
  if (w.size(a) % 16 != 0)
    throw UsageError(str("quantize_nvfp4: w: dim ", a, " is ", w.size(a), ", not a multiple of 16"));
  if (per_expert_global_scale && (w.dim() < 2 || a == 0))
    throw UsageError("quantize_nvfp4: a per-expert global scale needs >= 2 dims and a blocked axis other than 0");
  // torchao nvfp4_quantize with per_tensor_scale = amax / (448 · 6): the block scale amax_b / 6 is
  // divided by the global scale and rounded to E4M3; the data is multiplied by (1/global)/block_scale.
  at::Tensor x = w.to(at::kFloat);
  at::Tensor amax = per_expert_global_scale ? at::amax(x.abs().reshape({x.size(0), -1}), {1}) : x.abs().max();
  // An all-zero tensor (or expert) would give a zero global scale and 0/0 below; any positive scale
  // encodes zeros exactly, so use 1.
  // Divide by a tensor, not a scalar: ATen's CUDA division by a scalar multiplies by its reciprocal, which
  // can differ from the CPU (and torchao) quotient in the last bit.
  at::Tensor global = at::where(amax > 0, amax / at::full_like(amax, 448.0 * 6.0), at::ones_like(amax));

  at::Tensor xm = x.movedim(a, -1).contiguous();
  auto lead = xm.sizes().vec();
  const int64_t K = lead.back();
  lead.pop_back();
  std::vector<int64_t> blk = lead;
  blk.push_back(K / 16);
  blk.push_back(16);
  at::Tensor b = xm.reshape(blk);  // [..., K/16, 16]
  at::Tensor g = global;
  if (per_expert_global_scale) {
    std::vector<int64_t> gshape(blk.size() - 1, 1);
    gshape[0] = x.size(0);
    g = global.reshape(gshape);  // [E, 1, ..., 1] against [E, ..., K/16]
  }
  at::Tensor block_scale = at::amax(b.abs(), {-1}) / 6.0;
  at::Tensor s8 = at::clamp(block_scale / g, /*E4M3 tiny*/ 0.015625, 448.0)
                      .to(at::kFloat8_e4m3fn);
  at::Tensor recip = (at::reciprocal(g) * 1.0) / s8.to(at::kFloat);
  at::Tensor scaled = at::clamp(b * recip.unsqueeze(-1), -6.0, 6.0).reshape(xm.sizes());

  WeightTensor out;
  out.format = WeightFormat::nvfp4;
  out.shape = w.sizes().vec();
  out.blocksize = 16;
  out.axis = a;
  out.codes = pack_nibbles(e2m1_encode(scaled), /*first_high=*/false).movedim(-1, a).contiguous();
  out.scales = s8.movedim(-1, a).contiguous();
  out.global_scale = global.contiguous();
  return out;
}

namespace {

// fp8 values [..., R, C] times their block's scale ([..., ceil(R/br), ceil(C/bc)]) in fp32. Whole blocks are
// a broadcast view; ragged edges (R or C not a multiple of the block) gather each element's block scale, so edge
// blocks take their block's scale (DeepSeek's weight_dequant). The product of each element is the same fp32
// multiply either way.
at::Tensor fp8_decode(const at::Tensor& codes, const at::Tensor& scales, int64_t br, int64_t bc) {
  const int64_t R = codes.size(-2), C = codes.size(-1);
  at::Tensor v = codes.to(at::kFloat);
  if (R % br == 0 && C % bc == 0) {
    auto lead = codes.sizes().vec();
    lead.resize(lead.size() - 2);
    auto blk = lead, sc = lead;
    for (int64_t d : {R / br, br, C / bc, bc}) blk.push_back(d);
    for (int64_t d : {R / br, int64_t(1), C / bc, int64_t(1)}) sc.push_back(d);
    return (v.reshape(blk) * scales.reshape(sc)).reshape(codes.sizes());
  }
  // Each row's and column's block by index_select, not repeat_interleave: that one reads its output size back
  // from the device (a host sync: linear.lora's aten backend is graph-safe).
  auto block_of = [&](int64_t n, int64_t b) {
    return at::arange(n, scales.options().dtype(at::kLong)).div(b, "floor");
  };
  return v * scales.index_select(-2, block_of(R, br)).index_select(-1, block_of(C, bc));
}

}  // namespace

WeightTensor quantize_fp8_blocks(const at::Tensor& w, int64_t br, int64_t bc) {
  if (w.dim() < 2 || br < 1 || bc < 1)
    throw UsageError(str("quantize_fp8_blocks: needs >= 2 dims and positive blocks, got ", check::shape_str(w.sizes()), " in ",
                         br, "x", bc));
  const at::Tensor w32 = w.to(at::kFloat);
  const int64_t R = w.size(-2), C = w.size(-1), Rb = (R + br - 1) / br, Cb = (C + bc - 1) / bc;
  auto blk = w.sizes().vec();
  blk.resize(blk.size() - 2);
  for (int64_t d : {Rb, br, Cb, bc}) blk.push_back(d);
  at::Tensor amax = at::constant_pad_nd(w32, {0, Cb * bc - C, 0, Rb * br - R}).reshape(blk).abs().amax({-3, -1});
  // Python's `448.0 / t` is t.reciprocal() * 448 (Tensor.__rtruediv__), and `1.0 / scale` scale.reciprocal():
  // the same two roundings here.
  const at::Tensor pos = amax.gt(0), one = at::ones_like(amax);
  at::Tensor scale = at::where(pos, at::where(pos, amax, one).reciprocal() * 448.0, one);
  at::Tensor full = scale.repeat_interleave(br, -2).narrow(-2, 0, R).repeat_interleave(bc, -1).narrow(-1, 0, C);
  WeightTensor out;
  out.format = WeightFormat::fp8;
  out.shape = w.sizes().vec();
  out.block_rows = static_cast<int32_t>(br);
  out.blocksize = bc;
  out.codes = (w32 * full).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn).contiguous();
  out.scales = scale.reciprocal().contiguous();
  return out;
}

at::Tensor dequantize(const WeightTensor& w, at::ScalarType dtype, const at::Tensor& experts) {
  validate_weight(w, "dequantize: weight");
  if (experts.defined()) {
    if (w.dim() < 2) throw UsageError(str("dequantize: experts: needs a weight of >= 2 dims, got ", w.describe()));
    if (experts.scalar_type() != at::kLong || experts.dim() != 1)
      throw UsageError(str("dequantize: experts: must be a 1-dim int64 tensor, got ", check::dtype_str(experts.scalar_type()),
                           " ", check::shape_str(experts.sizes())));
  }
  const at::Tensor ids = experts.defined() ? experts.to(w.device()) : at::Tensor();
  const int64_t E = w.dim() >= 1 ? w.shape[0] : 1;
  auto out_shape = w.shape;
  if (ids.defined()) out_shape[0] = ids.numel();

  if (w.format == WeightFormat::dense)
    return (ids.defined() ? w.values.index_select(0, ids) : w.values).to(dtype);

  if (w.format == WeightFormat::fp8) {
    at::Tensor codes = w.codes, scales = w.scales;
    if (ids.defined()) {
      if (w.dim() < 3) throw UsageError(str("dequantize: experts: an fp8 weight's experts are a dim before its blocked two, got ", w.describe()));
      codes = codes.view(at::kByte).index_select(0, ids).view(at::kFloat8_e4m3fn);  // the bytes: no fp8 index kernel needed
      scales = scales.index_select(0, ids);
    }
    return fp8_decode(codes, scales, w.block_rows, w.blocksize).to(dtype);
  }

  if (w.format == WeightFormat::nf4) {
    const int64_t bs = w.blocksize, n = w.numel();
    at::Tensor absmax;
    if (w.double_quant()) {
      // bitsandbytes dequantize_blockwise then + offset: code[q] · nested_absmax[b / 256] + offset (fp32)
      const int64_t nb = n / bs;
      at::Tensor nested_idx = at::arange(nb, w.scales.options().dtype(at::kLong)).div(w.nested_blocksize, "floor");
      absmax = w.nested_code.index({w.scales.reshape(-1).to(at::kLong)}) * w.nested_scales.index({nested_idx}) +
               w.nested_offset;
    } else {
      absmax = w.scales.reshape(-1);
    }
    at::Tensor codes = w.codes.reshape(-1);
    if (ids.defined()) {
      const int64_t per = n / E;
      if (per % bs != 0)
        throw UsageError(str("dequantize: experts: selective nf4 needs each expert's ", per,
                             " elements to be a multiple of blocksize ", bs));
      codes = codes.view({E, per / 2}).index_select(0, ids);
      absmax = absmax.view({E, per / bs}).index_select(0, ids);
    }
    at::Tensor vals = table(nf4_values(), w.device()).index({unpack_nibbles(codes, true).to(at::kLong)});
    return (vals.reshape({-1, bs}) * absmax.reshape({-1, 1})).reshape(out_shape).to(dtype);
  }

  // mxfp4 / nvfp4
  const int64_t a = w.axis < 0 ? w.axis + w.dim() : w.axis;
  if (ids.defined() && a == 0) throw UsageError("dequantize: experts: the blocked axis of the weight is dim 0");
  at::Tensor codes = ids.defined() ? w.codes.index_select(0, ids) : w.codes;
  at::Tensor scales = ids.defined() ? w.scales.index_select(0, ids) : w.scales;
  at::Tensor vals = e2m1_decode(unpack_nibbles(codes.movedim(a, -1), false));  // [..., K]
  at::Tensor s = scales.movedim(a, -1);                                          // [..., K/bs]
  at::Tensor scale;
  if (w.format == WeightFormat::mxfp4) {
    scale = e8m0_decode(s);
  } else {
    at::Tensor g = w.global_scale.reshape(-1);
    if (g.numel() > 1) {
      if (ids.defined()) g = g.index_select(0, ids);
      std::vector<int64_t> gshape(static_cast<size_t>(s.dim()), 1);
      gshape[0] = g.numel();
      g = g.reshape(gshape);
    } else {
      g = g.reshape({});
    }
    scale = g * e4m3_decode(s);  // torchao: per_tensor_scale * scale_e4m3, then data * that
  }
  auto blk = vals.sizes().vec();
  const int64_t K = blk.back();
  blk.back() = K / w.blocksize;
  blk.push_back(w.blocksize);
  at::Tensor out = (vals.reshape(blk) * scale.unsqueeze(-1)).reshape(vals.sizes());
  return out.movedim(-1, a).to(dtype).contiguous();
}

// The helpers of quantizer.hpp: mechanism a plugin quantizer calls (core/layers.cmake keeps this file in core).
std::string quantize_misfit(const std::vector<int64_t>& shape, const QuantizeSpec& spec) {
  if (shape.empty()) return "a scalar has no blocks";
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  switch (spec.format) {
    case WeightFormat::dense: return "";
    case WeightFormat::nf4:
      if (numel % spec.blocksize != 0) return str(numel, " elements are not a multiple of blocksize ", spec.blocksize);
      return "";
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4: {
      const int64_t block = spec.format == WeightFormat::mxfp4 ? 32 : 16;
      const int64_t n = static_cast<int64_t>(shape.size());
      const int64_t axis = spec.axis < 0 ? spec.axis + n : spec.axis;
      if (axis < 0 || axis >= n) return str("axis ", spec.axis, " is outside a ", n, "-dim tensor");
      if (shape[static_cast<size_t>(axis)] % block != 0)
        return str("dim ", axis, " (", shape[static_cast<size_t>(axis)], ") is not a multiple of ", block);
      return "";
    }
    case WeightFormat::fp8: return "no quantizer writes fp8: weight_format fp8 keeps an FP8 checkpoint's weights as stored";
  }
  return "unknown format";
}

int64_t weight_bytes(const WeightTensor& w) {
  int64_t total = 0;
  std::set<const void*> seen;  // fields may share a storage
  for (const at::Tensor* t : {&w.values, &w.codes, &w.scales, &w.nested_scales, &w.nested_code, &w.global_scale}) {
    if (!t->defined()) continue;
    const auto& st = t->storage();
    if (seen.insert(st.data()).second) total += static_cast<int64_t>(st.nbytes());
  }
  return total;
}

}  // namespace ax::ops
