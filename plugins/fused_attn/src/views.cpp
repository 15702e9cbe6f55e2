// See views.hpp.
#include "views.hpp"

#include <ATen/ATen.h>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

namespace ax::fused_attn {

DType kernel_dtype(at::ScalarType t, const char* op) {
  if (t == at::kBFloat16) return DType::bf16;
  if (t == at::kHalf) return DType::fp16;
  if (t == at::kFloat) return DType::fp32;
  throw UsageError(str(op, "[fused_attn]: dtype ", c10::toString(t), " is not supported (bf16, fp16, fp32)"));
}

std::optional<View3> view3(const at::Tensor& t) {
  const int n = static_cast<int>(t.dim()) - 2;
  auto lead = plan::collapse(t.sizes().data(), t.strides().data(), n);
  if (!lead) return std::nullopt;
  return View3{t.data_ptr(), *lead, t.stride(-2), t.stride(-1)};
}

std::optional<View2> view2(const at::Tensor& t) {
  const int n = static_cast<int>(t.dim()) - 1;
  auto lead = plan::collapse(t.sizes().data(), t.strides().data(), n);
  if (!lead) return std::nullopt;
  return View2{t.data_ptr(), *lead, t.stride(-1)};
}

std::optional<View1> view1(const at::Tensor& t) {
  auto s = plan::collapse(t.sizes().data(), t.strides().data(), static_cast<int>(t.dim()));
  if (!s) return std::nullopt;
  return View1{t.data_ptr(), *s};
}

View3 view3_or_copy(const at::Tensor& t, at::Tensor& keep) {
  if (auto v = view3(t)) return *v;
  keep = t.contiguous();
  return *view3(keep);
}

View2 view2_or_copy(const at::Tensor& t, at::Tensor& keep) {
  if (auto v = view2(t)) return *v;
  keep = t.contiguous();
  return *view2(keep);
}

View1 view1_or_copy(const at::Tensor& t, at::Tensor& keep) {
  if (auto v = view1(t)) return *v;
  keep = t.contiguous();
  return *view1(keep);
}

plan::Operand operand(const View3& v, const at::Tensor& t) {
  plan::Operand o{reinterpret_cast<std::uintptr_t>(v.p), v.si, {}};
  int64_t tokens = 1;
  for (int64_t d = 0; d + 2 < t.dim(); ++d) tokens *= t.size(d);
  if (tokens > 1) o.row_strides.push_back(v.st);
  if (t.size(-2) > 1) o.row_strides.push_back(v.sh);
  return o;
}

plan::Operand operand(const View2& v, const at::Tensor& t) {
  plan::Operand o{reinterpret_cast<std::uintptr_t>(v.p), v.si, {}};
  if (t.numel() > t.size(-1)) o.row_strides.push_back(v.ld);
  return o;
}

plan::Operand operand(const View1& v) { return plan::Operand{reinterpret_cast<std::uintptr_t>(v.p), v.s, {}}; }

void* advance(void* p, int64_t elements, int64_t elem_bytes) { return static_cast<char*>(p) + elements * elem_bytes; }

}  // namespace ax::fused_attn
