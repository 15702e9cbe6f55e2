// The fp8 plugin's backends (fp8_plugin.cpp registers them).
#pragma once
#include <memory>

#include <axengine/ops/dequant.hpp>

namespace ax::fp8 {

std::shared_ptr<ops::Dequant> make_dequant();  // dequant_backend.cpp

}  // namespace ax::fp8
