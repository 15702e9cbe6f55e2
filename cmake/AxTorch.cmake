# Imports LibTorch from the torch wheel as the INTERFACE target ax::torch.
#
# The wheel is located through Python (AXENGINE_PYTHON, default: python3 on PATH), the same way
# torch.utils.cmake_prefix_path is. We import the libraries ourselves rather than calling
# find_package(Torch): TorchConfig of a CUDA wheel insists on a CUDA toolkit, and we must also build
# where there is none. Sets AXENGINE_TORCH_VERSION, AXENGINE_TORCH_CUDA ("13.0" or "none").
if(TARGET ax_torch)  # already imported (a project that includes the installed SDK twice)
  return()
endif()
if(NOT AXENGINE_PYTHON)
  find_program(AXENGINE_PYTHON NAMES python3 python REQUIRED)
endif()
execute_process(
  COMMAND ${AXENGINE_PYTHON} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or 'none'); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _ax_torch_out RESULT_VARIABLE _ax_torch_rc ERROR_VARIABLE _ax_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _ax_torch_rc EQUAL 0)
  message(FATAL_ERROR "axengine: cannot import torch with ${AXENGINE_PYTHON} (run scripts/setup.sh, or pass "
                      "-DAXENGINE_PYTHON=/path/to/python with torch 2.11.0):\n${_ax_torch_err}")
endif()
string(REPLACE "\n" ";" _ax_torch_out "${_ax_torch_out}")
list(GET _ax_torch_out 0 AXENGINE_TORCH_DIR)
list(GET _ax_torch_out 1 AXENGINE_TORCH_VERSION)
list(GET _ax_torch_out 2 AXENGINE_TORCH_CUDA)
list(GET _ax_torch_out 3 _ax_cxx11_abi)
message(STATUS "axengine: torch ${AXENGINE_TORCH_VERSION} (cuda ${AXENGINE_TORCH_CUDA}) at ${AXENGINE_TORCH_DIR}")
if(NOT AXENGINE_TORCH_VERSION MATCHES "^2\\.11\\.")
  message(WARNING "axengine is developed against torch 2.11.0; found ${AXENGINE_TORCH_VERSION}")
endif()

set(_ax_tlib ${AXENGINE_TORCH_DIR}/lib)
add_library(ax_torch INTERFACE)
add_library(ax::torch ALIAS ax_torch)
target_include_directories(ax_torch SYSTEM INTERFACE
  ${AXENGINE_TORCH_DIR}/include ${AXENGINE_TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(ax_torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${_ax_cxx11_abi} AXENGINE_TORCH_CUDA="${AXENGINE_TORCH_CUDA}")
# libtorch.so exports its own copies of std::filesystem symbols, and calling them crashes. Symbol lookup
# follows the order of DT_NEEDED entries, so libstdc++ must be needed before any torch library.
# The shared libstdc++ by its file name, not -lstdc++: a toolchain whose library dir holds only libstdc++.a
# (the GPU machine's /opt/gcc) would link that archive's objects into each library, and a second, private
# std::locale/ios_base in libaxengine.so crashed a Python process on the first formatted error message.
target_link_libraries(ax_torch INTERFACE "-Wl,--push-state,--no-as-needed" "-l:libstdc++.so.6" "-Wl,--pop-state"
  ${_ax_tlib}/libtorch.so ${_ax_tlib}/libtorch_cpu.so ${_ax_tlib}/libc10.so)
if(NOT AXENGINE_TORCH_CUDA STREQUAL "none" AND EXISTS ${_ax_tlib}/libtorch_cuda.so)
  # Nothing calls into libtorch_cuda directly, but loading it is what registers ATen's CUDA kernels:
  # keep it even under --as-needed.
  target_link_libraries(ax_torch INTERFACE
    "-Wl,--no-as-needed" ${_ax_tlib}/libtorch_cuda.so ${_ax_tlib}/libc10_cuda.so "-Wl,--as-needed")
  set(AXENGINE_TORCH_HAS_CUDA ON)
endif()
