// What an op's conformance problem generator (OpSpec::conformance) writes: problems — one call of the op
// with its inputs, which outputs to compare and how closely — and the generic checks they are handed to.
// The checks are written once, here, for every op (core's and plugins'):
//
//   accuracy     <op>/<phase>/<name>    outputs vs the reference backend's on the same inputs, within the
//                                       problem's tolerance; preallocated outputs surrounded by guard bands
//                                       (nothing written outside, the result returned in them); every
//                                       input bitwise unchanged after the call
//   cuda_graph   <op>/cuda_graph/<phase>/<name>   backends declared "graph_safe" on CUDA, for problems
//                                       marked `graph`: the call captured in a CUDA graph, new inputs copied
//                                       into the captured tensors, the replay compared with an eager call
//   determinism  <op>/determinism/<name>   two identical calls, bitwise identical outputs
//   repeat       <op>/repeat/<a>/then/<b>  A, then B, then A again: A's outputs bitwise unchanged
//   bad input    <op>/badinput/<prefix>/<what>   the call throws an exception naming the argument
//
// A generator states problems for what the backend claims (suite.dtypes(), formats(), layouts()) and may
// add op-specific math checks (Problem::extra, Suite::custom). Results land in the report of
// axengine/conformance.hpp. docs/ops/defining-an-op.md has a complete example.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "axengine/op_spec.hpp"

namespace ax::conformance {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;  // named, in a fixed order

// The backend object a call runs: an object of the op's interface (as registered).
struct Backend {
  void* object = nullptr;
  template <class Op>
  Op& as() const {
    return *static_cast<Op*>(object);
  }
};

// How a problem is bound to a device.
struct Bind {
  at::Device device = at::kCPU;
  // false: plain contiguous inputs, as the reference gets them; true: the inputs as the problem tests them
  // (e.g. non-contiguous views).
  bool as_tested = false;
  // 0: the problem's data. 1: other values of the same shapes and the same non-tensor arguments (the
  // CUDA-graph check copies them into the captured inputs).
  int draw = 0;
  // The call will be captured in a CUDA graph: switch off checks that read tensor values on the host
  // (the ops' `check_values`), as a hot path does.
  bool for_graph = false;
};

// One call of the op with its inputs built on one device.
struct Call {
  // Every tensor the call reads, named as the contract names them: the suite checks each is left bitwise
  // unchanged, and the CUDA-graph check refills them in place.
  Tensors inputs;
  // Runs `backend` on the inputs. `out`: preallocated outputs by name (those Problem::preallocated
  // lists), empty when the backend is to allocate. Returns the outputs by name.
  std::function<Tensors(const Backend& backend, const Tensors& out)> run;
};

struct Problem {
  std::string phase;  // "fwd", "bwd", ...: the case is "<op>/<phase>/<name>"
  std::string name;   // "bf16/dense/E=8,k=2/lora": dtype, format, shape, variant
  std::string dtype;  // the compute dtype (tolerance row)
  std::function<Call(const Bind& bind)> bind;
  // The outputs compared with the reference, with their norm-relative tolerance.
  std::vector<std::pair<std::string, double>> compare;
  // Outputs passed preallocated (as strided views inside guard bands); empty: the backend allocates.
  std::vector<std::string> preallocated;
  // Also run the CUDA-graph check on this problem (graph-safe backends on CUDA).
  bool graph = false;
  // Op-specific math after the comparison (e.g. exact zeros where the contract demands them). Gets the
  // tested backend's outputs and the reference's (moved to the tested device); returns a pass message or
  // calls fail(). Optional.
  std::function<std::string(const Tensors& got, const Tensors& want)> extra;
};

// A call that must be refused: `call` runs the backend on a broken version of a valid call and must throw
// an exception whose message names `argument`.
struct BadInput {
  std::string what;      // "x_dtype": the case is "<op>/badinput/<prefix>/<what>"
  std::string argument;  // "x"
  std::function<void(const Backend& backend)> call;
};

// The suite as one op's generator sees it: one backend under test on one device.
class Suite {
 public:
  struct State;  // the runner's (not part of the interface)
  explicit Suite(State& state) : state_(state) {}

  const OpSpec& spec() const;
  const std::string& backend_name() const;
  at::Device device() const;  // where the backend under test runs
  // What the backend claims, within the op's space.
  const std::vector<std::string>& dtypes() const;
  const std::vector<std::string>& formats() const;
  const std::vector<std::string>& layouts() const;
  bool claims_format(const std::string& format) const;
  bool claims_layout(const std::string& layout) const;
  bool quick() const;     // the CI grid: fewer random shapes, still every edge case
  unsigned seed() const;
  Backend backend() const;    // the backend under test
  Backend reference() const;  // the op's reference backend
  at::Device reference_device() const;  // where the reference runs

  // The generic checks (see the top of this file). Each records its case(s) in the report.
  void accuracy(const Problem& problem);
  void determinism(const Problem& problem);
  void repeat(const Problem& a, const Problem& b);
  void bad_inputs(const std::string& prefix, const std::vector<BadInput>& bad);
  // An op-specific case: `body` returns the pass message or calls fail() / skip().
  void custom(const std::string& name, const std::function<std::string()>& body);
  void skip(const std::string& name, const std::string& reason);

  State& state() const { return state_; }

 private:
  State& state_;
};

// Inside a case body: end the case failed / skipped with this message.
[[noreturn]] void fail(const std::string& message);
[[noreturn]] void skip(const std::string& reason);

// Checks for case bodies and Problem::extra (each returns a pass message or fails the case).
// Norm-relative closeness ||got - want|| / ||want|| <= tol (fp64 norms); shape and dtype must match.
std::string check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want, double tol);
// Bitwise equality.
std::string check_bitwise(const std::string& what, const at::Tensor& a, const at::Tensor& b);

// Helpers for generators.
at::ScalarType scalar_type(const std::string& dtype);  // "bf16" -> at::kBFloat16
// A generator seeded by the case name: a case draws the same data whatever else runs.
at::Generator case_generator(unsigned seed, const std::string& case_name);
// The same values in non-contiguous storage (every other column of a buffer whose gaps hold NaN).
at::Tensor non_contiguous(const at::Tensor& t);
// "E=8,k=2,T=17"
std::string kv(const std::vector<std::pair<std::string, long>>& items);
// The output named `name` in `outputs`; an undefined tensor when absent.
at::Tensor output(const Tensors& outputs, const std::string& name);

}  // namespace ax::conformance
