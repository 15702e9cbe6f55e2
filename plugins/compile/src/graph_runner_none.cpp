// Builds without LibTorch CUDA: no graphs (executor.hpp).
#include "executor.hpp"

namespace ax::compile {

std::unique_ptr<GraphRunner> make_graph_runner(const ExecutorContext&, const ExecutorSettings&, std::string& why_not) {
  why_not = "this build of the compile plugin has no CUDA";
  return nullptr;
}

}  // namespace ax::compile
