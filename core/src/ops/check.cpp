#include "ops/check.hpp"

#include <ATen/ATen.h>

namespace ax::ops::check {

void fail(const std::string& op, const std::string& arg, const std::string& what) {
  throw UsageError(str(op, ": ", arg, ": ", what));
}

std::string shape_str(at::IntArrayRef sizes) {
  std::vector<std::string> parts;
  for (auto s : sizes) parts.push_back(s < 0 ? "*" : std::to_string(s));
  return "[" + join(parts, ", ") + "]";
}

std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    default: return at::toString(t);
  }
}

void defined(const std::string& op, const std::string& arg, const at::Tensor& t) {
  if (!t.defined()) fail(op, arg, "is required but was not given");
}

void rank(const std::string& op, const std::string& arg, const at::Tensor& t, int64_t dim) {
  defined(op, arg, t);
  if (t.dim() != dim) fail(op, arg, str("must have ", dim, " dims, got shape ", shape_str(t.sizes())));
}

void shape(const std::string& op, const std::string& arg, const at::Tensor& t, std::vector<int64_t> sizes) {
  rank(op, arg, t, static_cast<int64_t>(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] >= 0 && t.size(static_cast<int64_t>(i)) != sizes[i])
      fail(op, arg, str("must have shape ", shape_str(sizes), ", got ", shape_str(t.sizes())));
}

void dtype(const std::string& op, const std::string& arg, const at::Tensor& t, at::ScalarType want) {
  defined(op, arg, t);
  if (t.scalar_type() != want)
    fail(op, arg, str("must be ", dtype_str(want), ", got ", dtype_str(t.scalar_type())));
}

void dtype_in(const std::string& op, const std::string& arg, const at::Tensor& t,
              std::initializer_list<at::ScalarType> allowed) {
  defined(op, arg, t);
  std::vector<std::string> names;
  for (auto a : allowed) {
    if (t.scalar_type() == a) return;
    names.push_back(dtype_str(a));
  }
  fail(op, arg, str("must be ", join(names, " or "), ", got ", dtype_str(t.scalar_type())));
}

void same_device(const std::string& op, const std::string& arg, const at::Tensor& t, const std::string& ref_arg,
                 const at::Device& ref) {
  defined(op, arg, t);
  if (t.device() != ref)
    fail(op, arg, str("is on ", t.device().str(), " but ", ref_arg, " is on ", ref.str()));
}

void compute_dtype(const std::string& op, const std::string& arg, const at::Tensor& t) {
  dtype_in(op, arg, t, {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble});
}

void out_like(const std::string& op, const std::string& arg, const at::Tensor& out, at::IntArrayRef sizes,
              at::ScalarType dt, const at::Device& device) {
  if (!out.defined()) return;
  if (out.sizes() != sizes)
    fail(op, arg, str("must have shape ", shape_str(sizes), ", got ", shape_str(out.sizes())));
  if (out.scalar_type() != dt) fail(op, arg, str("must be ", dtype_str(dt), ", got ", dtype_str(out.scalar_type())));
  if (out.device() != device) fail(op, arg, str("is on ", out.device().str(), ", expected ", device.str()));
}

void cu_seqlens(const std::string& op, const std::string& arg, const at::Tensor& cu, int64_t rows,
                const at::Device& device, const std::string& device_arg, bool values) {
  rank(op, arg, cu, 1);
  dtype(op, arg, cu, at::kInt);
  same_device(op, arg, cu, device_arg, device);
  if (cu.numel() < 2) fail(op, arg, "needs at least 2 entries (one sequence)");
  if (!values) return;
  at::Tensor host = cu.to(at::kCPU).contiguous();
  const int32_t* c = host.data_ptr<int32_t>();
  const int64_t n = host.numel();
  if (c[0] != 0) fail(op, arg, str("must start at 0, got ", c[0]));
  for (int64_t i = 1; i < n; ++i)
    if (c[i] < c[i - 1]) fail(op, arg, str("must be nondecreasing, got ", c[i - 1], " then ", c[i], " at ", i));
  if (c[n - 1] != rows) fail(op, arg, str("must end at the row count ", rows, ", got ", c[n - 1]));
}

}  // namespace ax::ops::check
