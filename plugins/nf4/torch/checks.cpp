// Argument checks of the axengine::nf4_* operators, shared by every kernel (ops.hpp): the Meta kernels run
// them at trace time, the CPU and CUDA kernels before core's own validators, so a wrong call fails with the
// same message naming the operator's argument (absmax, not core's `scales`) wherever it is made. Sizes
// are SymInts: under a trace they may be symbolic.
#include <ATen/ATen.h>
#include <c10/core/SymBool.h>

#include "ops.hpp"

namespace ax::nf4::torch_ops {
namespace {

c10::SymInt product(c10::SymIntArrayRef s) {
  c10::SymInt n = 1;
  for (const auto& d : s) n = n * d;
  return n;
}

void check_float(const at::Tensor& t, const char* what) {
  const auto dt = t.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf || dt == at::kDouble, "axengine nf4: ",
              what, " must be fp32, bf16, fp16 or fp64, got ", dt);
}

}  // namespace

// The nf4 weight fields: dtypes, and element counts against the logical shape.
void check_weight(const at::Tensor& codes, const at::Tensor& absmax, c10::SymIntArrayRef shape, int64_t blocksize,
                  const OptTensor& nested_absmax, const OptTensor& nested_code, int64_t nested_blocksize) {
  TORCH_CHECK(!shape.empty(), "axengine nf4: shape (quant_state.shape) must not be empty");
  TORCH_CHECK(blocksize >= 16 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0,
              "axengine nf4: blocksize must be a power of two in 16..4096, got ", blocksize);
  TORCH_CHECK(codes.scalar_type() == at::kByte, "axengine nf4: codes must be uint8, got ", codes.scalar_type());
  const c10::SymInt n = product(shape);
  TORCH_SYM_CHECK(codes.sym_numel().sym_eq(n / 2), "axengine nf4: codes must hold numel(shape)/2 = ", n / 2,
                  " bytes, got ", codes.sym_numel());
  TORCH_CHECK(nested_absmax.has_value() == nested_code.has_value(),
              "axengine nf4: a double-quantised weight needs both nested_absmax and nested_code");
  const at::ScalarType absmax_dtype = nested_absmax ? at::kByte : at::kFloat;
  TORCH_CHECK(absmax.scalar_type() == absmax_dtype, "axengine nf4: absmax must be ",
              nested_absmax ? "uint8 (double quant)" : "fp32", ", got ", absmax.scalar_type());
  TORCH_SYM_CHECK(absmax.sym_numel().sym_eq(n / blocksize), "axengine nf4: absmax must hold numel(shape)/blocksize = ",
                  n / blocksize, " values, got ", absmax.sym_numel());
  if (nested_absmax) {
    TORCH_CHECK(nested_absmax->scalar_type() == at::kFloat && nested_code->scalar_type() == at::kFloat,
                "axengine nf4: nested_absmax and nested_code must be fp32");
    TORCH_SYM_CHECK(nested_code->sym_numel().sym_eq(256), "axengine nf4: nested_code must have 256 entries");
    TORCH_CHECK(nested_blocksize > 0, "axengine nf4: nested_blocksize must be positive, got ", nested_blocksize);
    const c10::SymInt nested = (n / blocksize + nested_blocksize - 1) / nested_blocksize;
    TORCH_SYM_CHECK(nested_absmax->sym_numel().sym_eq(nested), "axengine nf4: nested_absmax must hold ", nested,
                    " values (one per nested_blocksize absmax), got ", nested_absmax->sym_numel());
  }
}

// x [*, K] against the [N, K] weight, bias [N], lora_a [r, K], lora_b [N, r], all in x's dtype.
void check_linear(const at::Tensor& x, c10::SymIntArrayRef shape, const OptTensor& bias, const OptTensor& lora_a,
                  const OptTensor& lora_b) {
  TORCH_CHECK(shape.size() == 2, "axengine nf4_linear: the weight must be 2-dim [N, K], got ", shape.size(), " dims");
  check_float(x, "x");
  TORCH_CHECK(x.dim() >= 1, "axengine nf4_linear: x must be [..., K]");
  const c10::SymInt &N = shape[0], &K = shape[1];
  TORCH_SYM_CHECK(x.sym_size(-1).sym_eq(K), "axengine nf4_linear: x has ", x.sym_size(-1),
                  " features but the weight has K = ", K);
  auto same_dtype = [&](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == x.scalar_type(), "axengine nf4_linear: ", what, " must have x's dtype ",
                x.scalar_type(), ", got ", t.scalar_type());
  };
  if (bias) {
    same_dtype(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1, "axengine nf4_linear: bias must be [N]");
    TORCH_SYM_CHECK(bias->sym_size(0).sym_eq(N), "axengine nf4_linear: bias must be [N] with N = ", N);
  }
  TORCH_CHECK(lora_a.has_value() == lora_b.has_value(), "axengine nf4_linear: LoRA needs both lora_a and lora_b");
  if (lora_a) {
    same_dtype(*lora_a, "lora_a");
    same_dtype(*lora_b, "lora_b");
    TORCH_CHECK(lora_a->dim() == 2 && lora_b->dim() == 2, "axengine nf4_linear: lora_a is [r, K], lora_b [N, r]");
    const c10::SymInt r = lora_a->sym_size(0);
    TORCH_SYM_CHECK(lora_a->sym_size(1).sym_eq(K), "axengine nf4_linear: lora_a must be [r, K] with K = ", K);
    TORCH_SYM_CHECK(lora_b->sym_size(0).sym_eq(N).sym_and(lora_b->sym_size(1).sym_eq(r)),
                    "axengine nf4_linear: lora_b must be [N, r] = [", N, ", ", r, "]");
  }
}

void check_out_dtype(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble,
              "axengine nf4_dequantize: dtype must be fp32, bf16, fp16 or fp64, got ", dtype);
}

}  // namespace ax::nf4::torch_ops
