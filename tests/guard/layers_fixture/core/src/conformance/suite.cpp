// conformance including a built-ins header: a violation
#include <axengine/builtins.hpp>
