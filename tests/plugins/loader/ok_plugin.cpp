// A valid plugin: provides the optimizer "test_sgd".
#include "axengine/plugin.hpp"
#include "sgd_optimizer.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_ok", "version": "1.2.3",
  "providers": [{"kind": "optimizer", "name": "test_sgd", "summary": "plain SGD for loader tests"}]})")

AXENGINE_PLUGIN_REGISTER(reg) { reg.optimizer("test_sgd", std::make_shared<ax_test::SgdProvider>()); }
