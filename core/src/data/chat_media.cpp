// The key functions of axengine/chat_media.hpp's interfaces: their type info lives in libaxengine (core), which a
// plugin links, so the chat_template type (a built-in) finds a plugin's ChatImageSupport with dynamic_cast.
#include "axengine/chat_media.hpp"

namespace ax {
ChatImageProcessor::~ChatImageProcessor() = default;
ChatImageSupport::~ChatImageSupport() = default;
}  // namespace ax
