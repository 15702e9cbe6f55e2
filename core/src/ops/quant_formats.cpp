#include "axengine/ops/quant_formats.hpp"

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "ops/check.hpp"

namespace ax::ops {

const char* to_string(WeightFormat format) {
  switch (format) {
    case WeightFormat::dense: return "dense";
    case WeightFormat::nf4: return "nf4";
    case WeightFormat::mxfp4: return "mxfp4";
    case WeightFormat::nvfp4: return "nvfp4";
    case WeightFormat::fp8: return "fp8";
  }
  return "?";
}

std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  for (auto f : {WeightFormat::dense, WeightFormat::nf4, WeightFormat::mxfp4, WeightFormat::nvfp4, WeightFormat::fp8})
    if (name == to_string(f)) return f;
  return std::nullopt;
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: throw UsageError(str("dtype ", at::toString(dtype), " is not a compute dtype (fp32, bf16, fp16)"));
  }
}

std::optional<at::ScalarType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  if (name == "fp64" || name == "float64") return at::kDouble;
  return std::nullopt;
}

WeightTensor WeightTensor::dense(at::Tensor values) {
  WeightTensor w;
  w.format = WeightFormat::dense;
  if (values.defined()) w.shape = values.sizes().vec();
  w.values = std::move(values);
  return w;
}

int64_t WeightTensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  if (d < 0 || d >= n) throw UsageError(str("weight ", describe(), " has no dim ", d));
  return shape[static_cast<size_t>(d)];
}

int64_t WeightTensor::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

at::Device WeightTensor::device() const {
  if (values.defined()) return values.device();
  if (codes.defined()) return codes.device();
  return at::Device(at::kCPU);
}

std::string WeightTensor::describe() const {
  std::string s = str(to_string(format), check::shape_str(shape));
  if (format == WeightFormat::dense && values.defined()) s += " " + check::dtype_str(values.scalar_type());
  if (format == WeightFormat::fp8) s += str(" blocks ", block_rows, "x", blocksize);
  else if (format != WeightFormat::dense) s += str(" blocksize ", blocksize);
  if (format == WeightFormat::mxfp4 || format == WeightFormat::nvfp4) s += str(" axis ", axis);
  if (double_quant()) s += " double-quant";
  return s;
}

WeightTensor WeightTensor::to(const at::Device& device) const {
  WeightTensor w = *this;
  for (at::Tensor* t : {&w.values, &w.codes, &w.scales, &w.nested_scales, &w.nested_code, &w.global_scale})
    if (t->defined()) *t = t->to(device);
  return w;
}

namespace {

// "<what>.<field>" for messages: validate_weight's `what` is "moe.experts: weight" style (op: arg).
[[noreturn]] void bad(const std::string& what, const std::string& field, const std::string& msg) {
  throw UsageError(str(what, field.empty() ? "" : ".", field, ": ", msg));
}

void need(const std::string& what, const std::string& field, const at::Tensor& t, at::ScalarType dt,
          int64_t numel, const at::Device& dev) {
  if (!t.defined()) bad(what, field, "is required for this format but was not given");
  if (t.scalar_type() != dt)
    bad(what, field, str("must be ", check::dtype_str(dt), ", got ", check::dtype_str(t.scalar_type())));
  if (numel >= 0 && t.numel() != numel)
    bad(what, field, str("must have ", numel, " elements, got ", t.numel(), " (shape ", check::shape_str(t.sizes()), ")"));
  if (t.device() != dev) bad(what, field, str("is on ", t.device().str(), " but codes are on ", dev.str()));
}

void need_shape(const std::string& what, const std::string& field, const at::Tensor& t, const std::vector<int64_t>& s) {
  if (t.sizes().vec() != s)
    bad(what, field, str("must have shape ", check::shape_str(s), ", got ", check::shape_str(t.sizes())));
}

}  // namespace

void validate_weight(const WeightTensor& w, const std::string& what) {
  for (auto s : w.shape)
    if (s < 0) bad(what, "shape", str("has a negative size: ", check::shape_str(w.shape)));
  if (w.format == WeightFormat::dense) {
    if (!w.values.defined()) bad(what, "values", "a dense weight needs its values");
    const auto dt = w.values.scalar_type();
    if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf && dt != at::kDouble)
      bad(what, "values", str("must be fp32, bf16 or fp16, got ", check::dtype_str(dt)));
    if (w.values.sizes().vec() != w.shape)
      bad(what, "shape", str("is ", check::shape_str(w.shape), " but values have shape ", check::shape_str(w.values.sizes())));
    return;
  }
  if (w.shape.empty()) bad(what, "shape", "a quantised weight needs its logical shape");
  if (!w.codes.defined()) bad(what, "codes", "is required for a quantised weight but was not given");
  const at::Device dev = w.codes.device();
  const int64_t n = w.numel();
  if (n == 0) bad(what, "shape", str("is empty: ", check::shape_str(w.shape)));

  if (w.format == WeightFormat::fp8) {
    if (w.dim() < 2) bad(what, "shape", str("an fp8 weight has at least 2 dims (block rows x columns), got ", check::shape_str(w.shape)));
    if (w.block_rows < 1 || w.block_rows > 65536) bad(what, "block_rows", str("must be in 1..65536, got ", w.block_rows));
    if (w.blocksize < 1 || w.blocksize > 65536) bad(what, "blocksize", str("must be in 1..65536, got ", w.blocksize));
    need(what, "codes", w.codes, at::kFloat8_e4m3fn, -1, dev);
    need_shape(what, "codes", w.codes, w.shape);
    std::vector<int64_t> grid = w.shape;
    grid[grid.size() - 2] = (grid[grid.size() - 2] + w.block_rows - 1) / w.block_rows;
    grid.back() = (grid.back() + w.blocksize - 1) / w.blocksize;
    need(what, "scales", w.scales, at::kFloat, -1, dev);
    need_shape(what, "scales", w.scales, grid);
    return;
  }
  if (w.format == WeightFormat::nf4) {
    const int64_t bs = w.blocksize;
    if (bs < 16 || bs > 4096 || (bs & (bs - 1)) != 0)
      bad(what, "blocksize", str("must be a power of two in 16..4096 for nf4, got ", bs));
    if (n % bs != 0)
      bad(what, "blocksize", str("the weight's ", n, " elements are not a multiple of blocksize ", bs));
    need(what, "codes", w.codes, at::kByte, n / 2, dev);
    const int64_t nblocks = n / bs;
    if (w.double_quant()) {
      need(what, "scales", w.scales, at::kByte, nblocks, dev);
      if (w.nested_blocksize <= 0) bad(what, "nested_blocksize", str("must be positive, got ", w.nested_blocksize));
      need(what, "nested_scales", w.nested_scales, at::kFloat, (nblocks + w.nested_blocksize - 1) / w.nested_blocksize, dev);
      need(what, "nested_code", w.nested_code, at::kFloat, 256, dev);
    } else {
      need(what, "scales", w.scales, at::kFloat, nblocks, dev);
    }
    return;
  }

  // mxfp4 / nvfp4: blocks along `axis`
  const bool mx = w.format == WeightFormat::mxfp4;
  const int64_t want_bs = mx ? 32 : 16;
  if (w.blocksize != want_bs)
    bad(what, "blocksize", str("must be ", want_bs, " for ", to_string(w.format), ", got ", w.blocksize));
  const int64_t nd = w.dim();
  const int64_t axis = w.axis < 0 ? w.axis + nd : w.axis;
  if (axis < 0 || axis >= nd) bad(what, "axis", str("is ", w.axis, ", outside a ", nd, "-dim shape"));
  if (w.shape[axis] % want_bs != 0)
    bad(what, "shape", str("dim ", axis, " (the blocked axis) is ", w.shape[axis], ", not a multiple of ", want_bs));
  std::vector<int64_t> cs = w.shape, ss = w.shape;
  cs[axis] /= 2;
  ss[axis] /= want_bs;
  need(what, "codes", w.codes, at::kByte, -1, dev);
  need_shape(what, "codes", w.codes, cs);
  if (mx) {
    need(what, "scales", w.scales, at::kByte, -1, dev);
  } else {
    if (!w.scales.defined()) bad(what, "scales", "is required for nvfp4 but was not given");
    if (w.scales.scalar_type() != at::kFloat8_e4m3fn && w.scales.scalar_type() != at::kByte)
      bad(what, "scales", str("must be float8_e4m3fn (or uint8 bits), got ", check::dtype_str(w.scales.scalar_type())));
    if (w.scales.device() != dev) bad(what, "scales", str("is on ", w.scales.device().str(), " but codes are on ", dev.str()));
    if (!w.global_scale.defined()) bad(what, "global_scale", "is required for nvfp4 but was not given");
    need(what, "global_scale", w.global_scale, at::kFloat, -1, dev);
    const auto g = w.global_scale.numel();
    if (!(g == 1 && w.global_scale.dim() <= 1) && !(w.global_scale.dim() == 1 && g == w.shape[0]))
      bad(what, "global_scale", str("must be a scalar or [", w.shape[0], "] (one per expert), got shape ",
                                    check::shape_str(w.global_scale.sizes())));
  }
  need_shape(what, "scales", w.scales, ss);
}

}  // namespace ax::ops
