// The CUDA-graph check (op_conformance.hpp): capture one call of a graph-safe backend, copy other inputs of
// the same shapes into the captured tensors, replay, and compare with an eager call on those inputs. A
// backend that syncs with the host during capture fails the capture itself; one that bakes values read at
// capture time (routing counts, sequence lengths) into the graph fails the comparison.
// Compiled only when LibTorch has CUDA and a CUDA toolkit is present (core/CMakeLists.txt): ATen's
// CUDAGraph keeps the allocations of the capture in a private pool, which a raw stream capture cannot.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {

bool cuda_graphs_built() { return true; }

namespace {
std::string message_of(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}
}  // namespace

std::string check_cuda_graph(const Problem& p, const Backend& backend, at::Device device) {
  c10::cuda::CUDAGuard device_guard(device.index());
  Call call = p.bind({device, true, 0, true});
  Tensors captured;
  at::cuda::CUDAGraph graph;
  {
    // Capture needs a side stream; warm up there first (lazy initialisation must not happen in capture).
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
    c10::cuda::CUDAStreamGuard stream_guard(side);
    call.run(backend, {});
    side.synchronize();
    graph.capture_begin();
    try {
      captured = call.run(backend, {});
    } catch (const std::exception& e) {
      const std::string why = message_of(e);
      try {
        graph.capture_end();
      } catch (...) {  // the capture is already invalid: what matters is why
      }
      fail(str("the call cannot be captured in a CUDA graph: ", why.substr(0, 400)));
    }
    try {
      graph.capture_end();
    } catch (const std::exception& e) {
      fail(str("the capture was invalidated (a host sync or an illegal call during capture): ",
               message_of(e).substr(0, 400)));
    }
  }
  // New values in the captured inputs: the replay must compute on them.
  Call other = p.bind({device, true, 1, true});
  for (auto& [name, t] : call.inputs) {
    if (!t.defined()) continue;
    at::Tensor src = output(other.inputs, name);
    if (!src.defined() || src.sizes() != t.sizes())
      fail(str("the problem's second draw changes input '", name, "' (a generator bug): cannot refill it"));
    t.copy_(src);
  }
  graph.replay();
  c10::cuda::device_synchronize();
  Tensors eager = call.run(backend, {});
  std::vector<std::string> msgs;
  for (const auto& [name, tol] : p.compare)
    msgs.push_back(check_close(str(name, " replay vs eager"), output(captured, name), output(eager, name), tol));
  msgs.push_back("captured once, replayed with new inputs");
  return join(msgs, "; ");
}

}  // namespace ax::conformance::detail
