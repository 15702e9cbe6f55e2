// Scratch directories for tests. std::filesystem::remove_all must not be used: libtorch.so exports its own
// copy of the std::filesystem implementation, and its remove_all crashes (jumps to a null pointer) when it
// has something to remove. nftw does the same job without that copy.
#pragma once
#include <ftw.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace ax::test {

inline void remove_tree(const std::filesystem::path& p) {
  nftw(
      p.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return std::remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// A fresh, empty directory under the system temp dir, unique per test name and process.
inline std::filesystem::path scratch_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / ("axengine_" + name + "_" + std::to_string(::getpid()));
  remove_tree(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace ax::test
