# CUTLASS 3 / CuTe headers for the grouped GEMMs built on CUTLASS's collectives (plugins/sonicmoe/cutlass/),
# from the nvidia-cutlass wheel that scripts/setup.sh installs into the torch virtualenv (only its headers
# are used: cutlass_library/source/include), or from AX_CUTLASS_INCLUDE. Without them those targets are not
# built (a machine without the wheel still builds everything else).
set(AX_CUTLASS_INCLUDE "" CACHE PATH "CUTLASS include dir (cutlass/cutlass.h, cute/); default: the nvidia-cutlass wheel of AXENGINE_PYTHON")
set(AXENGINE_HAVE_CUTLASS OFF)
set(_ax_cutlass_include "${AX_CUTLASS_INCLUDE}")
if(NOT _ax_cutlass_include)
  # find_spec, not import: the package's Python side needs dependencies we do not install.
  execute_process(
    COMMAND ${AXENGINE_PYTHON} -c
      "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(os.path.dirname(s.origin), 'source', 'include'))"
    OUTPUT_VARIABLE _ax_cutlass_include RESULT_VARIABLE _ax_cutlass_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _ax_cutlass_rc EQUAL 0)
    set(_ax_cutlass_include "")
  endif()
endif()
if(_ax_cutlass_include AND EXISTS "${_ax_cutlass_include}/cutlass/cutlass.h" AND EXISTS "${_ax_cutlass_include}/cute/tensor.hpp")
  set(AXENGINE_HAVE_CUTLASS ON)
  add_library(ax_cutlass INTERFACE)
  target_include_directories(ax_cutlass SYSTEM INTERFACE ${_ax_cutlass_include})
  # NDEBUG: CUTLASS's device asserts put calls between wgmma instructions, which ptxas then serialises.
  target_compile_definitions(ax_cutlass INTERFACE NDEBUG)
  target_compile_options(ax_cutlass INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  message(STATUS "axengine: CUTLASS headers at ${_ax_cutlass_include}")
else()
  message(STATUS "axengine: no CUTLASS headers (pip install --no-deps nvidia-cutlass, or AX_CUTLASS_INCLUDE): "
                 "the CUTLASS grouped GEMMs are not built")
endif()
