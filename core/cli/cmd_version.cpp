#include <iostream>

#include <torch/headeronly/version.h>

#include "axengine/plugin.hpp"
#include "axengine/version.hpp"
#include "command.hpp"

namespace {

int run_version(const std::vector<std::string>& args) {
  boost::program_options::options_description opts("version options");
  boost::program_options::variables_map vm;
  if (!ax::cli::parse_options("axengine version", args, opts, vm)) return 0;
  std::cout << "axengine " << ax::kVersion << "\n"
            << "plugin ABI " << AXENGINE_DESCRIPTOR_ABI << "\n"
            << "fingerprint: torch " << AXENGINE_DESCRIPTOR_TORCH << ", cuda " << AXENGINE_TORCH_CUDA << ", "
            << AXENGINE_DESCRIPTOR_COMPILER << ", cxx11 abi " << AXENGINE_DESCRIPTOR_CXX11_ABI << "\n";
  return 0;
}

ax::cli::CommandRegistrar reg({"version", "print the version, plugin ABI and build fingerprint", run_version});

}  // namespace
