// autotune_gemm through LibTorch's TunableOp (tunable.hpp). TunableOp times the cuBLAS/cuBLASLt candidates
// of each new GEMM shape on first use and keeps the fastest; its results file is read at the first tuned GEMM
// and written when the process exits (TuningContext's destructor), so a later run on the same GPU model starts tuned.
#include <filesystem>

#include <ATen/cuda/tunable/Tunable.h>

#include <axengine/strings.hpp>

#include "tunable.hpp"

namespace ax::compile {

std::string set_gemm_tuning(bool on, const DeviceInfo& device, const std::string& cache_dir) {
  auto* ctx = at::cuda::tunable::getTuningContext();
  if (!on || !device.is_cuda()) {
    ctx->EnableTunableOp(false);
    return on ? "autotune_gemm: not a CUDA run; nothing to tune" : "";
  }
  const std::string file = gemm_tuning_file(device, cache_dir);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  ctx->SetFilename(file, /*insert_device_ordinal=*/false);
  ctx->EnableTunableOp(true);
  ctx->EnableTuning(true);
  return ax::str("autotune_gemm: TunableOp on, results in ", file);
}

}  // namespace ax::compile
