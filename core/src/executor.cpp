// select_executor (axengine/executor.hpp): plugins' executors first, in registration order, core's eager last.
#include "axengine/executor.hpp"

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax {

std::unique_ptr<StepExecutor> select_executor(const Registry& registry, const ExecutorContext& context) {
  std::unique_ptr<StepExecutor> chosen;
  std::string chosen_key;
  for (const Provider* p : registry.list(ProviderKind::executor)) {
    if (p->info.plugin == "builtin") continue;
    auto provider = std::static_pointer_cast<ExecutorProvider>(p->object);
    std::unique_ptr<StepExecutor> e = provider->create(context);
    if (!e) continue;
    if (chosen)
      throw UsageError(str("two step executors want this run: ", chosen_key, " (", chosen->name(), ") and ",
                           p->info.key(), " from ", p->info.origin, "; configure only one of them"));
    chosen = std::move(e);
    chosen_key = p->info.key() + " from " + p->info.origin;
  }
  if (chosen) return chosen;
  if (const Provider* eager = registry.find(ProviderKind::executor, "", "eager"))
    if (auto e = std::static_pointer_cast<ExecutorProvider>(eager->object)->create(context)) return e;
  return std::make_unique<EagerExecutor>();  // a registry without the built-ins (tests): the same thing
}

}  // namespace ax
