// Provides "test_sgd" again (taken by test_ok when both load) and "test_sgd2" (new): the duplicate must be
// refused, naming both origins, while the new one is kept.
#include "axengine/plugin.hpp"
#include "sgd_optimizer.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_dup", "version": "0.1.0",
  "providers": [{"kind": "optimizer", "name": "test_sgd"}, {"kind": "optimizer", "name": "test_sgd2"}]})")

AXENGINE_PLUGIN_REGISTER(reg) {
  reg.optimizer("test_sgd", std::make_shared<ax_test::SgdProvider>());
  reg.optimizer("test_sgd2", std::make_shared<ax_test::SgdProvider>());
}
