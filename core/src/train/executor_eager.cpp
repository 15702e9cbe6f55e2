// Core's step executor "eager" (axengine/executor.hpp): the trainer's step as it is, one launch after another.
#include "axengine/executor.hpp"
#include "train/executors.hpp"

namespace ax::train {

namespace {
class EagerProvider final : public ExecutorProvider {
 public:
  std::unique_ptr<StepExecutor> create(const ExecutorContext&) const override { return std::make_unique<EagerExecutor>(); }
};
}  // namespace

void register_builtin_executors(Registry& registry) {
  Provider p;
  p.info.kind = ProviderKind::executor;
  p.info.name = "eager";
  p.info.summary = "runs each training step as it is issued (the default; [compile] cuda_graphs replaces it)";
  p.object = std::make_shared<EagerProvider>();
  registry.add(std::move(p));
}

}  // namespace ax::train
