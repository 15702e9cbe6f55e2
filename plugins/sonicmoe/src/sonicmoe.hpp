// The sonicmoe moe.mlp backend (docs/plugins/sonicmoe.md): the whole expert block on Hopper with the
// gather fused into the gate_up GEMM's operand loads, the GLU into its epilogue, and dGLU plus the
// router-score gradient into the epilogue of the backward's dH GEMM (kernels/gather_gemm.hpp).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <axengine/ops/moe_mlp.hpp>

namespace ax::sonicmoe {

// Why the kernels cannot serve these (valid) args, or nullopt: a pure function of shapes, dtypes,
// formats and flags (decline.cpp; no CUDA needed, so CPU tests check it).
std::optional<std::string> decline_reason(const ops::MoeMlpArgs& args);

// The backend object (block.cpp).
std::shared_ptr<ops::MoeMlp> make_backend();

}  // namespace ax::sonicmoe
