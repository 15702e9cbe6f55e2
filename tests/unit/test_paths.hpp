// Scratch directories for tests. (libtorch.so's broken std::filesystem copies are kept out of reach by the
// link order in cmake/AxTorch.cmake, so std::filesystem is safe to use here.)
#pragma once
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace ax::test {

inline void remove_tree(const std::filesystem::path& p) {
  std::error_code ec;
  std::filesystem::remove_all(p, ec);
}

// A fresh, empty directory under the system temp dir, unique per test name and process.
inline std::filesystem::path scratch_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / ("axengine_" + name + "_" + std::to_string(::getpid()));
  remove_tree(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace ax::test
