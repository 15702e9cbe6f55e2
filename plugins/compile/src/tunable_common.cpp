#include <cctype>
#include <filesystem>

#include <axengine/strings.hpp>

#include "tunable.hpp"

namespace ax::compile {

// One file per GPU model and arch: a result tuned on one GPU says nothing about another.
std::string gemm_tuning_file(const DeviceInfo& device, const std::string& cache_dir) {
  std::string name;
  for (char c : device.name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return (std::filesystem::path(cache_dir) / ax::str("tunableop_", name, "_", device.arch_name(), ".csv")).string();
}

}  // namespace ax::compile
