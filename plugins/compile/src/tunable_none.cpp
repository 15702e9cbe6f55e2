// autotune_gemm without LibTorch CUDA support in this build: nothing to tune (tunable.hpp).
#include "tunable.hpp"

namespace ax::compile {

std::string set_gemm_tuning(bool on, const DeviceInfo&, const std::string&) {
  return on ? "autotune_gemm: this build has no CUDA GEMMs to tune; ignored" : "";
}

}  // namespace ax::compile
