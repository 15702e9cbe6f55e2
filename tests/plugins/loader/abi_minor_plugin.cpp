// A valid plugin whose descriptor claims the host's ABI major with minor 0 (AXENGINE_DESCRIPTOR_ABI, set by
// tests/plugins/CMakeLists.txt): it must load, since a minor bump only adds what old plugins never use.
// Provides the optimizer "<AX_TEST_NAME>_sgd".
#include "axengine/plugin.hpp"
#include "sgd_optimizer.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": ")" AX_TEST_NAME R"(", "version": "0.1.0",
  "providers": [{"kind": "optimizer", "name": ")" AX_TEST_NAME R"(_sgd"}]})")

AXENGINE_PLUGIN_REGISTER(reg) { reg.optimizer(AX_TEST_NAME "_sgd", std::make_shared<ax_test::SgdProvider>()); }
