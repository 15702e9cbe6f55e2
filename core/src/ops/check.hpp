// Argument checks shared by the validate() functions of every op: each failure throws UsageError
// "<op>: <argument>: <what is wrong>", so a backend author (and the conformance suite) sees which
// argument broke the contract.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::ops::check {

[[noreturn]] void fail(const std::string& op, const std::string& arg, const std::string& what);

std::string shape_str(at::IntArrayRef sizes);
std::string dtype_str(at::ScalarType t);  // "bf16", "int64", ...

// `t` must be defined.
void defined(const std::string& op, const std::string& arg, const at::Tensor& t);
// Defined, of rank `dim`.
void rank(const std::string& op, const std::string& arg, const at::Tensor& t, int64_t dim);
// Defined, with exactly these sizes (-1 = any).
void shape(const std::string& op, const std::string& arg, const at::Tensor& t, std::vector<int64_t> sizes);
void dtype(const std::string& op, const std::string& arg, const at::Tensor& t, at::ScalarType want);
void dtype_in(const std::string& op, const std::string& arg, const at::Tensor& t,
              std::initializer_list<at::ScalarType> allowed);
// Same device as `ref` (named ref_arg in the message).
void same_device(const std::string& op, const std::string& arg, const at::Tensor& t, const std::string& ref_arg,
                 const at::Device& ref);
// Floating compute dtypes the ops accept: fp32, bf16, fp16 (and fp64, for gradient checks).
void compute_dtype(const std::string& op, const std::string& arg, const at::Tensor& t);
// No element may be NaN/inf is NOT checked (values are the caller's business); this checks that a
// preallocated output matches what the op will produce.
void out_like(const std::string& op, const std::string& arg, const at::Tensor& out, at::IntArrayRef sizes,
              at::ScalarType dtype, const at::Device& device);
// Sequence offsets of packed rows: int32 [N+1] on `device`, N >= 1; with `values` (a device sync) also
// cu[0] == 0, nondecreasing, cu[N] == rows.
void cu_seqlens(const std::string& op, const std::string& arg, const at::Tensor& cu, int64_t rows,
                const at::Device& device, const std::string& device_arg, bool values);

}  // namespace ax::ops::check
