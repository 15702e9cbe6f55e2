// Registers a provider, then throws: nothing it registered may be kept.
#include <stdexcept>

#include "axengine/plugin.hpp"
#include "sgd_optimizer.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_throws", "version": "0.1.0",
  "providers": [{"kind": "optimizer", "name": "test_throw_sgd"}]})")

AXENGINE_PLUGIN_REGISTER(reg) {
  reg.optimizer("test_throw_sgd", std::make_shared<ax_test::SgdProvider>());
  throw std::runtime_error("registration failed on purpose");
}
