// mechanism including built-ins and conformance: two violations
#include "models/decoder.hpp"
#include "axengine/conformance.hpp"
