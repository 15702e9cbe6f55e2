// Internals of the conformance suite: the target under test, the case runner, and the pieces of the generic
// checks (guard bands, "throws naming X", inputs left untouched) that suite.cpp runs; weight helpers for the
// per-op problem files. Not installed: conformance.hpp and op_conformance.hpp are the public side.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "axengine/conformance.hpp"
#include "axengine/op_conformance.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/registry.hpp"

namespace ax::conformance::detail {

// The public helpers (op_conformance.hpp), used unqualified by the per-op files.
using ax::conformance::case_generator;
using ax::conformance::check_bitwise;
using ax::conformance::check_close;
using ax::conformance::fail;
using ax::conformance::kv;
using ax::conformance::non_contiguous;
using ax::conformance::scalar_type;
using ax::conformance::skip;

// Thrown inside a case body: the case fails / is skipped with this message.
struct CaseFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct CaseSkip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One backend on one device, with what it claims (already intersected with what the op defines).
struct Target {
  const Provider* backend = nullptr;
  const Provider* reference = nullptr;  // the op's `reference` backend
  at::Device device = at::kCPU;         // where the backend under test runs
  at::Device reference_device = at::kCPU;  // where the reference runs (CPU when the backend IS reference on CUDA)
  std::vector<std::string> dtypes;      // "fp32", "bf16", "fp16"
  std::vector<std::string> formats;     // weight formats: "dense", "nf4", ...
  std::vector<std::string> layouts;     // op-specific layouts
  bool quick = false;
  unsigned seed = 0;

  bool claims_dtype(const std::string& d) const;
  bool claims_format(const std::string& f) const;
  bool claims_layout(const std::string& l) const;
};

// Collects the cases of one target. The body returns the pass message (e.g. measured errors) or throws.
class CaseRunner {
 public:
  CaseRunner(const Target& target, std::string device_name, std::vector<CaseResult>& out,
             const std::function<void(const CaseResult&)>& on_case,
             const std::function<void(const std::string&)>& on_start);
  void run(const std::string& name, const std::function<std::string()>& body);
  void skip_case(const std::string& name, const std::string& reason);

 private:
  void record(CaseResult r);
  const Target& target_;
  std::string device_name_;
  std::vector<CaseResult>& out_;
  const std::function<void(const CaseResult&)>& on_case_;
  const std::function<void(const std::string&)>& on_start_;
};

// dtype names as the contracts and Requirements spell them (scalar_type: the other way).
std::string dtype_name(at::ScalarType t);

// ||got - want||_2 / max(||want||_2, tiny), in float64 on the CPU. NaN when got has NaN/Inf anywhere.
double rel_error(const at::Tensor& got, const at::Tensor& want);
// check_close (op_conformance.hpp) fails unless got has want's shape and dtype and rel_error <= tol; it
// returns "what err=1.2e-03 tol=1.0e-02" for the pass message.
// For outputs that can be zero by cancellation rather than by structure (attention's dq and dk over a
// single key: softmax of one score is constant): a reference below tol * scale, where `scale` is the norm
// of a sibling output of the same magnitude (dv), is rounding noise around zero (the fp32 oracle leaves
// ~1e-8, a bf16/fp16 kernel ~1e-3 of the scale: their ratio means nothing), so the output is held to
// ||got - want|| <= tol * scale instead.
std::string check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want, double tol,
                        double zero_scale);
// Fails unless fn throws a std::exception whose message contains `argument` (case-sensitive).
// A crash cannot be caught in-process: it takes the run down, which the CLI reports as a failure.
std::string check_throws_naming(const std::string& argument, const std::function<void()>& fn);

// The bytes of t's elements in logical order, on the CPU (bitwise comparisons: NaN != NaN and -0 == +0
// would hide differences in a value comparison).
at::Tensor bytes_of(const at::Tensor& t);

// Snapshots tensors before a call and fails if any changed (bitwise) after it: the op interfaces return
// fresh outputs, so "writes only its outputs" means "never writes its inputs".
class InputGuard {
 public:
  void add(const std::string& name, const at::Tensor& t);
  std::string check() const;  // fails naming the first modified input; returns "N inputs unchanged"

 private:
  std::vector<std::pair<std::string, std::pair<at::Tensor, at::Tensor>>> saved_;  // name -> (live, copy)
};

// A preallocated output for the ops' `out` arguments: a strided view into a larger buffer whose
// guard band (everything outside the view) holds a poison pattern. check() fails if the backend wrote
// outside the view, did not write the result into it, or returned another tensor.
class GuardedOut {
 public:
  GuardedOut(at::IntArrayRef shape, at::ScalarType dtype, at::Device device, int64_t guard = 3);
  const at::Tensor& view() const { return view_; }
  std::string check(const std::string& what, const at::Tensor& returned) const;

 private:
  at::Tensor buffer_, pristine_, mask_, view_;  // mask_: true inside the view
};

// non_contiguous (op_conformance.hpp): every other column of a twice-as-wide buffer whose odd columns
// hold a poison value, so a kernel that ignores strides reads garbage.

// A weight in one of the formats the suite tests, from an fp32 master. `variant`: "dense", "nf4",
// "nf4-dq" (double-quantised absmax), "nf4-b16" / "nf4-dq-b32" (blocksize 16 / 32 instead of 64),
// "mxfp4", "nvfp4", "nvfp4-pe" (per-expert global scale), "fp8" (fine-grained FP8, 128 x 128 blocks of the last
// two dims) and "fp8-b8x16" (8 x 16 blocks, ragged edges);
// `axis` is the blocked (reduction) axis for mxfp4/nvfp4. Dense weights are cast to `dtype`.
ops::WeightTensor make_weight(const at::Tensor& w32, const std::string& variant, int64_t axis, at::ScalarType dtype);
std::string base_format(const std::string& variant);  // "nf4-dq" -> "nf4"
ops::WeightTensor weight_to(const ops::WeightTensor& w, at::Device device);

// Free memory on the CUDA device `index` in bytes (0 if it cannot be asked).
std::size_t cuda_free_bytes(int index);

// The per-op problem generators of core's ops (OpSpec::conformance).
void dequant_problems(Suite& suite);
void attention_problems(Suite& suite);
void moe_experts_problems(Suite& suite);
void moe_mlp_problems(Suite& suite);
// moe.experts' test routings (moe_experts.cpp): "random" top-k, "zero_tokens" (most experts empty), "remote"
// (-1 entries after the last offset), "dropped" (-1 entries inside expert ranges). Seeded by `g`.
ops::MoeRouting moe_test_routing(int64_t E, int64_t k, int64_t T, const std::string& mode, at::Generator& g);
void norm_rope_problems(Suite& suite);
void linear_lora_problems(Suite& suite);
void rms_norm_problems(Suite& suite);
void swiglu_problems(Suite& suite);
void linear_ce_problems(Suite& suite);
void linear_attention_problems(Suite& suite);
void causal_conv1d_problems(Suite& suite);

// The CUDA-graph check of one problem (op_conformance.hpp); built only where ATen's CUDA graphs are
// (core/src/conformance/cuda/): elsewhere cuda_graphs_built() is false.
bool cuda_graphs_built();
std::string check_cuda_graph(const Problem& problem, const Backend& backend, at::Device device);

}  // namespace ax::conformance::detail

namespace ax::conformance {

// What the runner hands an op's generator: the op, the target and where its cases go.
struct Suite::State {
  const OpSpec* spec = nullptr;
  detail::Target target;
  detail::CaseRunner* cases = nullptr;
};

}  // namespace ax::conformance
