// The GPU that is really there, as opposed to the one selection was asked to assume (AXENGINE_ARCH /
// device.arch make DeviceInfo describe a GPU without one being present, so explain can plan for it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "axengine/device.hpp"

namespace ax {

struct PhysicalGpu {
  int arch = 0;  // compute capability x10
  std::string name;
};

// CUDA device `index` as the driver reports it; nullopt when LibTorch sees no CUDA device.
std::optional<PhysicalGpu> physical_gpu(int index);

// CUDA device `index`'s total memory in bytes, from the driver without creating a context; nullopt when there
// is no such device or the driver does not say.
std::optional<std::uint64_t> gpu_total_memory(int index);

// Why `run` cannot train on `device` here: an arch override (AXENGINE_ARCH or device.arch) that this machine
// does not match — no GPU, another GPU, or device.type = "cpu" (`type`, the config's). nullopt when it can.
std::optional<std::string> run_device_problem(const DeviceInfo& device, const std::string& type);

}  // namespace ax
