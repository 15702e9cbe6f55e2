// ATen tensors as the kernels address them (../kernels/kernels.hpp views), and the operands the vector
// check (plan::vectorisable) sees. No CUDA here: tests/plan_test.cpp checks these on CPU tensors
// (padded windows, every-other-column views, transposes).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

#include "../kernels/kernels.hpp"
#include "plan.hpp"

namespace ax::fused_attn {

// The kernels' dtype of a compute dtype (bf16, fp16, fp32); anything else is a UsageError naming `op`.
DType kernel_dtype(at::ScalarType t, const char* op);

// [*lead, H, D] with the lead dims walked as one token index; nothing when they do not collapse.
std::optional<View3> view3(const at::Tensor& t);
// [*, C] with the leading dims walked as one row index; nothing when they do not collapse.
std::optional<View2> view2(const at::Tensor& t);
// [*] walked as one index; nothing when the dims do not collapse.
std::optional<View1> view1(const at::Tensor& t);

// The same, or of a contiguous copy kept in `keep` when the caller's tensor does not collapse (inputs).
View3 view3_or_copy(const at::Tensor& t, at::Tensor& keep);
View2 view2_or_copy(const at::Tensor& t, at::Tensor& keep);
View1 view1_or_copy(const at::Tensor& t, at::Tensor& keep);

// The operand plan::vectorisable checks: row strides of the dims that have more than one row.
plan::Operand operand(const View3& v, const at::Tensor& t);
plan::Operand operand(const View2& v, const at::Tensor& t);
plan::Operand operand(const View1& v);

// p advanced by `elements` elements of `elem_bytes` each.
void* advance(void* p, int64_t elements, int64_t elem_bytes);

}  // namespace ax::fused_attn
