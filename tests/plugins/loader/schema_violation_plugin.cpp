// Built once per descriptor mistake the strict schema must catch (AX_TEST_CASE picks it). Each would have
// loaded before the schema existed — "require" silently widening the provider's claim to every device,
// dtype and format — so its code aborts the process if it ever runs: only a refusal passes the test.
#include <cstdlib>

#include "axengine/plugin.hpp"

#if AX_TEST_CASE == 1  // "requires" misspelled
AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_schema_require_typo", "version": "0.1.0",
  "providers": [{"kind": "kernel", "op": "moe.experts", "name": "typo_moe",
                 "require": {"devices": ["cuda"], "arch_min": "sm_90", "dtypes": ["bf16"]}}]})")
#elif AX_TEST_CASE == 2  // a provider key the schema does not know
AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_schema_unknown_key", "version": "0.1.0",
  "providers": [{"kind": "optimizer", "name": "unknown_key_sgd", "priority": 10}]})")
#elif AX_TEST_CASE == 3  // a dtype name that is not one
AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_schema_bad_dtype", "version": "0.1.0",
  "providers": [{"kind": "kernel", "op": "dequant", "name": "bad_dtype_dequant",
                 "requires": {"devices": ["cpu"], "dtypes": ["bf61"]}}]})")
#else
#error "AX_TEST_CASE must be 1, 2 or 3"
#endif

namespace {
[[maybe_unused]] const int kAbortOnLoad = (std::abort(), 0);
}

AXENGINE_PLUGIN_REGISTER(reg) { (void)reg; }
