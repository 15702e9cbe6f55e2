// The kernel conformance suite: certifies op backends against the `reference` backend of the same op,
// the way torch.library.opcheck certifies a PyTorch custom op. The ops are the registry's OpSpecs (core's
// and those plugins define, axengine/op_spec.hpp); each spec's generator states the problems and the
// generic checks of axengine/op_conformance.hpp run them.
//
// For every selected backend and every device it can run on, the suite runs the op's cases: a shape
// grid with the edge cases (experts with zero tokens, E=1, k=1, k=E, odd ranks, T=1, sizes that are no
// multiple of any tile, non-contiguous inputs) in each dtype / weight format / layout the backend CLAIMS
// in its Requirements, forward and backward, compared with norm-relative tolerances per dtype
// (conformance::tolerance, the numbers docs/ops/*.md quote); determinism where the contract demands it
// (bitwise equal over two runs); the same call twice; bad input (an exception naming the argument);
// inputs left untouched (the op interfaces return fresh tensors, so there are no caller-owned output
// buffers to guard: instead every input is compared bitwise before and after the call); index products
// beyond 2^31 on CUDA when the GPU has the memory; for backends declared graph-safe, capture in a CUDA
// graph and replay with new inputs. Devices that are not present are skipped with a reason.
//
// Results are plain data: the CLI (`axengine conformance`) prints a summary and writes JUnit XML, tests
// assert on case names.
#pragma once
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "axengine/registry.hpp"

namespace ax::conformance {

enum class Status { pass, fail, skip };
const char* to_string(Status status);

struct CaseResult {
  std::string op;       // "moe.experts"
  std::string backend;  // "scattermoe"
  std::string plugin;   // plugin name, or "builtin"
  std::string device;   // "cpu", "cuda"
  // Descriptive and unique within (op, backend, device), e.g.
  // "moe.experts/fwd/bf16/dense/EKN/E=8,k=2,T=17,K=65,N=130,r=3/grouped_out".
  std::string name;
  Status status = Status::pass;
  std::string message;  // for numeric checks: the measured error and the tolerance; for skips: why
  double seconds = 0;
};

// Norm-relative tolerances ||got - want||_2 / ||want||_2 (norms in fp64; when ||want|| = 0, got must be
// exactly zero) per compute dtype: the policy of docs/ops/README.md, which each contract quotes. This
// table is the one place the numbers of core's ops live in code (their OpSpecs' tolerance rows are made
// from it); change it and the docs together.
//   forward            — every op's outputs (y, out), except dequant's;
//   backward           — gradients, except attention's;
//   attention_backward — attention's dq, dk, dv (dP − D subtracts nearly equal terms; P is rounded);
//   dequant            — dequant's output: one rounding of a table value times a scale.
// attention's lse (fp32 whatever the input dtype) has its own bound, kLseTolerance. The planted-bug
// plugins in tests/plugins/conformance/ show these bounds still catch real bugs.
struct Tolerance {
  const char* dtype;
  double forward;
  double backward;
  double attention_backward;
  double dequant;
};
inline constexpr Tolerance kTolerances[] = {
    {"fp32", 1e-5, 1e-5, 1e-4, 1e-6},
    {"bf16", 2e-2, 2e-2, 3e-2, 4e-3},
    {"fp16", 5e-3, 5e-3, 1e-2, 5e-4},
};
inline constexpr double kLseTolerance = 1e-4;
// Throws UsageError for a dtype without an entry.
Tolerance tolerance(const std::string& dtype);

struct Options {
  std::string op;       // op id or config key; empty: every op in the registry
  std::string backend;  // one backend name; empty: every backend registered for the op(s)
  std::vector<std::string> plugins;  // plugin names or files: only their backends; empty: no filter
  std::string device;   // "cpu" or "cuda"; empty: every device the backend claims (absent ones skip)
  bool quick = false;   // the CI grid: fewer random shapes, still every edge case
  unsigned seed = 20240521;
  // Called before each case starts (its name) and after it ends (progress output, watchdogs). Optional.
  std::function<void(const std::string& name)> on_start;
  std::function<void(const CaseResult&)> on_case;
};

struct Report {
  std::vector<CaseResult> cases;
  int count(Status status) const;
  bool ok() const { return count(Status::fail) == 0; }
};

// Runs the suite over the backends in `registry` that `options` select. Throws UsageError when the
// op, backend or plugin filter matches nothing (naming what is registered); never throws for a failing
// backend: each failure is a case in the report.
Report run(const Registry& registry, const Options& options);

// A readable summary: per backend and device passed/failed/skipped, then every failing case with its
// message. `verbose` lists skipped cases and their reasons too.
void print_summary(const Report& report, std::ostream& os, bool verbose = false);

// JUnit XML: one <testsuite> per (op, backend, device), one <testcase> per case.
void write_junit(const Report& report, std::ostream& os);

}  // namespace ax::conformance
