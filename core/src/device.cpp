#include "axengine/device.hpp"

#include <ATen/Context.h>
#include <dlfcn.h>

#include <cstdlib>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "device_probe.hpp"

namespace ax {
namespace {

// The compute capability and name come from the CUDA runtime that LibTorch already loaded. Looking the
// two functions up at run time keeps the core free of CUDA headers, so it builds without a toolkit.
struct CudaProps {
  int major = 0, minor = 0;
  std::string name;
};

CudaProps query_cuda(int index) {
  using AttrFn = int (*)(int*, int, int);
  using NameFn = int (*)(char*, int, int);
  CudaProps p;
  auto attr = reinterpret_cast<AttrFn>(dlsym(RTLD_DEFAULT, "cudaDeviceGetAttribute"));
  if (!attr) throw RuntimeError("cannot query the GPU: the CUDA runtime is not loaded");
  constexpr int kMajor = 75, kMinor = 76;  // cudaDevAttrComputeCapabilityMajor / Minor
  if (attr(&p.major, kMajor, index) != 0 || attr(&p.minor, kMinor, index) != 0)
    throw RuntimeError(str("cannot query compute capability of CUDA device ", index));
  // The driver API names the device; cudart has no plain-C entry for it.
  // The driver library is loaded by the runtime but not into the global scope: ask for it by name.
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (auto get_name = reinterpret_cast<NameFn>(driver ? dlsym(driver, "cuDeviceGetName") : nullptr)) {
    char buf[256] = {0};
    if (get_name(buf, sizeof buf - 1, index) == 0) p.name = buf;
  }
  if (p.name.empty()) p.name = str("CUDA device ", index);
  return p;
}

}  // namespace

std::optional<PhysicalGpu> physical_gpu(int index) {
  if (!at::hasCUDA()) return std::nullopt;
  CudaProps p = query_cuda(index);
  return PhysicalGpu{p.major * 10 + p.minor, p.name};
}

std::optional<std::uint64_t> gpu_total_memory(int index) {
  if (!at::hasCUDA()) return std::nullopt;  // also starts the runtime, which initialises the driver
  using GetFn = int (*)(int*, int);
  using MemFn = int (*)(std::size_t*, int);
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  auto get = reinterpret_cast<GetFn>(driver ? dlsym(driver, "cuDeviceGet") : nullptr);
  auto mem = reinterpret_cast<MemFn>(driver ? dlsym(driver, "cuDeviceTotalMem_v2") : nullptr);
  int dev = 0;
  std::size_t bytes = 0;
  if (!get || !mem || get(&dev, index) != 0 || mem(&bytes, dev) != 0) return std::nullopt;
  return bytes;
}

std::optional<std::string> run_device_problem(const DeviceInfo& device, const std::string& type) {
  if (!device.is_cuda() || device.arch_source == "detected") return std::nullopt;
  const std::string asked = device.arch_source == "AXENGINE_ARCH" ? str("AXENGINE_ARCH=", ax::arch_name(device.arch))
                                                                  : str("device.arch = \"", ax::arch_name(device.arch), "\"");
  const std::string what = str(asked, " selects kernels as on an ", ax::arch_name(device.arch), " GPU, but ");
  const std::string planning = "; validate and plugins explain accept it for planning";
  if (type == "cpu")
    return str(what, "device.type = \"cpu\" asks to train on the CPU: unset the arch override to train here", planning);
  auto gpu = physical_gpu(device.index);
  if (!gpu) return str(what, "this machine has no CUDA device: run it where that GPU is, or unset the override", planning);
  if (gpu->arch != device.arch)
    return str(what, "this machine's GPU is ", ax::arch_name(gpu->arch), " (", gpu->name,
               "): kernels chosen for another GPU may not run here; unset the override", planning);
  return std::nullopt;
}

std::string arch_name(int arch) { return arch > 0 ? str("sm_", arch) : std::string("cpu"); }

std::string DeviceInfo::arch_name() const { return is_cuda() ? ax::arch_name(arch) : std::string("cpu"); }

std::optional<int> parse_arch(std::string_view t) {
  if (t.rfind("sm_", 0) == 0) t.remove_prefix(3);
  if (!t.empty() && t.back() == 'a') t.remove_suffix(1);  // sm_90a: same device, arch-specific code
  if (t.empty() || t.size() > 3) return std::nullopt;
  int v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v < 30) return std::nullopt;
  return v;
}

DeviceInfo detect_device(const std::string& type, const std::string& arch_override) {
  if (type != "auto" && type != "cpu" && type != "cuda")
    throw UsageError(str("device type '", type, "' is not one of auto, cpu, cuda"));
  DeviceInfo d;
  std::string override_text = arch_override;
  std::string override_source = "config device.arch";
  if (const char* env = std::getenv("AXENGINE_ARCH"); env && *env) {
    override_text = env;
    override_source = "AXENGINE_ARCH";
  }
  const bool has_cuda = at::hasCUDA();
  if (type == "cuda" && !has_cuda && override_text.empty())
    throw UsageError("device.type = \"cuda\", but this machine has no CUDA device (\"auto\" trains on the CPU here; "
                     "device.arch or AXENGINE_ARCH plans for a GPU without one)");
  if (!override_text.empty()) {
    // Pretend to be that GPU: selection behaves as it would there (used by explain and by tests).
    auto arch = parse_arch(override_text);
    if (!arch) throw UsageError(str(override_source, ": '", override_text, "' is not a CUDA arch like sm_90 or sm_120"));
    d.type = DeviceInfo::Type::cuda;
    d.arch = *arch;
    d.arch_source = override_source;
    d.name = str("(as ", ax::arch_name(*arch), ")");
    if (has_cuda && type != "cpu") d.name = query_cuda(0).name + " " + d.name;
    return d;
  }
  if (type == "cpu" || !has_cuda) return d;
  CudaProps p = query_cuda(0);
  d.type = DeviceInfo::Type::cuda;
  d.arch = p.major * 10 + p.minor;
  d.name = p.name;
  return d;
}

}  // namespace ax
