// LibTorch's TunableOp (at::cuda::tunable) for [compile] autotune_gemm: CUDA builds only (tunable_cuda.cpp);
// elsewhere (tunable_none.cpp) it reports that there is nothing to tune.
#pragma once
#include <string>

#include <axengine/device.hpp>

namespace ax::compile {

// Turns GEMM tuning on or off for this process; on: results read from and written to one file per GPU model
// in `cache_dir` (e.g. tunableop_NVIDIA_H200_sm90.csv). Returns what it did, for the log.
std::string set_gemm_tuning(bool on, const DeviceInfo& device, const std::string& cache_dir);

// The file name set_gemm_tuning uses for a device (exposed for tests).
std::string gemm_tuning_file(const DeviceInfo& device, const std::string& cache_dir);

}  // namespace ax::compile
