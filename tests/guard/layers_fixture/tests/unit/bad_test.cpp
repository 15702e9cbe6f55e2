// a core test including a plugin source: a violation
#include "../../plugins/foo/src/impl.cpp"
