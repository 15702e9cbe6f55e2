// The sonicmoe plugin: the sm_90a backend of moe.mlp (docs/plugins/sonicmoe.md). Its requirements keep
// selection off every GPU but Hopper (the kernels are wgmma/TMA code in an sm_90a cubin), off fp16/fp32
// and off quantised weights, so `plugins explain` shows why scattermoe serves there; calls inside those
// that the tiles cannot take are declined at run time (decline.cpp) and go to the next backend.
#include <axengine/plugin.hpp>

#include "sonicmoe.hpp"

// (Plain literals: a multi-line raw string inside a macro argument trips some preprocessors.)
// arch_max sm_90: sm_100 has no wgmma (its tensor-core MMAs are tcgen05) and an sm_90a cubin does not run
// there; the default preference list then picks scattermoe on Blackwell.
AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"sonicmoe\", \"version\": \"0.1.0\","
    " \"summary\": \"Hopper moe.mlp: gather fused into a wgmma grouped GEMM, GLU and dGLU in its epilogues\","
    " \"providers\": [{\"kind\": \"kernel\", \"op\": \"moe.mlp\", \"name\": \"sonicmoe\","
    " \"requires\": {\"devices\": [\"cuda\"], \"arch_min\": \"sm_90\", \"arch_max\": \"sm_90\", \"dtypes\": [\"bf16\"],"
    " \"formats\": [\"dense\"], \"layouts\": [\"EKN\", \"ENK\"]}}]}")

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeMlp>("sonicmoe", ax::sonicmoe::make_backend()); }
