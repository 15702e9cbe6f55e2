// The generic conformance checks (op_conformance.hpp), written once for every op: accuracy against the
// reference with guard bands and untouched inputs, determinism, repeatability, bad input, and the
// CUDA-graph capture of graph-safe backends. The per-op files only state problems.
#include <optional>

#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance {
namespace {

using detail::GuardedOut;
using detail::InputGuard;

Tensors moved(const Tensors& ts, at::Device device) {
  Tensors out;
  for (const auto& [n, t] : ts) out.emplace_back(n, t.defined() ? t.to(device) : t);
  return out;
}

}  // namespace

const OpSpec& Suite::spec() const { return *state_.spec; }
const std::string& Suite::backend_name() const { return state_.target.backend->info.name; }
at::Device Suite::device() const { return state_.target.device; }
at::Device Suite::reference_device() const { return state_.target.reference_device; }
const std::vector<std::string>& Suite::dtypes() const { return state_.target.dtypes; }
const std::vector<std::string>& Suite::formats() const { return state_.target.formats; }
const std::vector<std::string>& Suite::layouts() const { return state_.target.layouts; }
bool Suite::claims_format(const std::string& f) const { return state_.target.claims_format(f); }
bool Suite::claims_layout(const std::string& l) const { return state_.target.claims_layout(l); }
bool Suite::quick() const { return state_.target.quick; }
unsigned Suite::seed() const { return state_.target.seed; }
Backend Suite::backend() const { return {state_.target.backend->object.get()}; }
Backend Suite::reference() const { return {state_.target.reference->object.get()}; }

void Suite::accuracy(const Problem& p) {
  const at::Device dev = device();
  state_.cases->run(str(spec().id, "/", p.phase, "/", p.name), [&] {
    Tensors want = p.bind({reference_device(), false, 0, false}).run(reference(), {});
    Call call = p.bind({dev, true, 0, false});
    // Preallocated outputs: strided views with guard bands, shaped like the reference's outputs.
    std::vector<std::pair<std::string, GuardedOut>> guarded;
    Tensors out;
    for (const auto& n : p.preallocated) {
      at::Tensor w = output(want, n);
      if (!w.defined()) fail(str("the reference returned no '", n, "' to preallocate"));
      guarded.emplace_back(n, GuardedOut(w.sizes(), w.scalar_type(), dev));
      out.emplace_back(n, guarded.back().second.view());
    }
    InputGuard inputs;
    for (const auto& [n, t] : call.inputs) inputs.add(n, t);
    Tensors got = call.run(backend(), out);
    std::vector<std::string> msgs;
    for (const auto& [n, g] : guarded) msgs.push_back(g.check(n, output(got, n)));
    Tensors want_here = moved(want, dev);
    for (const auto& [n, tol] : p.compare) msgs.push_back(check_close(n, output(got, n), output(want_here, n), tol));
    if (p.extra) msgs.push_back(p.extra(got, want_here));
    msgs.push_back(inputs.check());
    return join(msgs, "; ");
  });
  if (!p.graph || !state_.target.backend->info.graph_safe) return;
  const std::string graph_name = str(spec().id, "/cuda_graph/", p.phase, "/", p.name);
  if (!dev.is_cuda()) return skip(graph_name, "CUDA graphs are captured on CUDA devices only");
  if (!detail::cuda_graphs_built())
    return skip(graph_name, "this axengine was built without CUDA graph support (no CUDA LibTorch or toolkit)");
  state_.cases->run(graph_name, [&] { return detail::check_cuda_graph(p, backend(), dev); });
}

void Suite::determinism(const Problem& p) {
  state_.cases->run(str(spec().id, "/determinism/", p.name), [&] {
    Call call = p.bind({device(), false, 0, false});
    Tensors first = call.run(backend(), {}), second = call.run(backend(), {});
    std::vector<std::string> msgs;
    for (const auto& [n, t] : first)
      if (t.defined()) msgs.push_back(check_bitwise(n, t, output(second, n)));
    return join(msgs, "; ");
  });
}

void Suite::repeat(const Problem& a, const Problem& b) {
  state_.cases->run(str(spec().id, "/repeat/", a.name, "/then/", b.name), [&] {
    // No state may carry over between calls (a cache keyed on a pointer or a shape).
    Call ca = a.bind({device(), false, 0, false}), cb = b.bind({device(), false, 0, false});
    Tensors first = ca.run(backend(), {});
    cb.run(backend(), {});
    Tensors again = ca.run(backend(), {});
    std::vector<std::string> msgs;
    for (const auto& [n, t] : first)
      if (t.defined()) msgs.push_back(check_bitwise(n, t, output(again, n)));
    return join(msgs, "; ");
  });
}

void Suite::bad_inputs(const std::string& prefix, const std::vector<BadInput>& bad) {
  for (const auto& b : bad)
    state_.cases->run(str(spec().id, "/badinput/", prefix, "/", b.what),
                      [&] { return detail::check_throws_naming(b.argument, [&] { b.call(backend()); }); });
}

void Suite::custom(const std::string& name, const std::function<std::string()>& body) { state_.cases->run(name, body); }

void Suite::skip(const std::string& name, const std::string& reason) { state_.cases->skip_case(name, reason); }

}  // namespace ax::conformance
