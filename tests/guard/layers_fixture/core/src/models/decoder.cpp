// built-ins may include conformance: no violation
#include "conformance/harness.hpp"
