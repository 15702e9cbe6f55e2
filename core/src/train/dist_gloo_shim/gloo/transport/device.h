// See ../../README.md: only what ProcessGroupGloo.hpp names.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
