// The nf4 plugin's providers (each in its own .cpp); nf4_plugin.cpp registers them.
#pragma once
#include <axengine/ops/dequant.hpp>
#include <axengine/ops/linear_lora.hpp>
#include <axengine/ops/quantizer.hpp>
#include <memory>

namespace ax::nf4 {

std::shared_ptr<ops::Dequant> make_dequant();
std::shared_ptr<ops::LinearLora> make_linear_lora();
std::shared_ptr<ops::Quantizer> make_quantizer();

}  // namespace ax::nf4
