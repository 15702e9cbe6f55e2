// Built twice with a descriptor the host must refuse (another plugin ABI; another LibTorch). Its code
// must never run: loading it at all aborts the process, so a loader that dlopens before checking the
// descriptor fails the test loudly.
#include <cstdlib>

#include "axengine/plugin.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": ")" AX_TEST_NAME R"(", "version": "0.1.0", "providers": []})")

namespace {
[[maybe_unused]] const int kAbortOnLoad = (std::abort(), 0);
}

AXENGINE_PLUGIN_REGISTER(reg) { (void)reg; }
