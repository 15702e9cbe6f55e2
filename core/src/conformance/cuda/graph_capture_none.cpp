// The CUDA-graph check where this build has no CUDA LibTorch or no CUDA toolkit: graph cases skip
// (core/CMakeLists.txt picks this file or graph_capture.cpp).
#include "conformance/harness.hpp"

namespace ax::conformance::detail {

bool cuda_graphs_built() { return false; }

std::string check_cuda_graph(const Problem&, const Backend&, at::Device) {
  skip("this axengine was built without CUDA graph support");
}

}  // namespace ax::conformance::detail
