# cuDNN's fused attention for the fused_attn plugin (plugins/fused_attn/src/cudnn_attention.cpp): the
# header-only cudnn_frontend graph API (PyPI wheel nvidia-cudnn-frontend, scripts/requirements.txt) over the
# libcudnn.so.9 and cudnn.h of the nvidia-cudnn wheel that the torch wheel depends on (already loaded with
# LibTorch's CUDA library). Located through AXENGINE_PYTHON like torch (cmake/AxTorch.cmake), or given:
#   AX_CUDNN_FRONTEND_INCLUDE  a directory holding cudnn_frontend.h (the GPU machine has no such wheel:
#                              scripts/gpu-test.sh passes the copy carried in .axdev).
# AXENGINE_WITH_CUDNN_ATTENTION: AUTO (default) builds the backend when both are found, ON requires them,
# OFF never builds it. Defines the INTERFACE target ax_cudnn_attention and AXENGINE_HAVE_CUDNN_ATTENTION.
set(AXENGINE_WITH_CUDNN_ATTENTION AUTO CACHE STRING "fused_attn's cuDNN attention backend: AUTO, ON, OFF")
set_property(CACHE AXENGINE_WITH_CUDNN_ATTENTION PROPERTY STRINGS AUTO ON OFF)
set(AX_CUDNN_FRONTEND_INCLUDE "" CACHE PATH "directory holding cudnn_frontend.h (default: from the nvidia-cudnn-frontend wheel)")
add_library(ax_cudnn_attention INTERFACE)
set(AXENGINE_HAVE_CUDNN_ATTENTION OFF)
if(NOT AXENGINE_WITH_CUDNN_ATTENTION STREQUAL "OFF")
  execute_process(
    COMMAND ${AXENGINE_PYTHON} -c [=[
import os, importlib.util as u
s = u.find_spec("nvidia.cudnn")
print(os.path.dirname(s.origin) if s and s.origin else (list(s.submodule_search_locations)[0] if s else ""))
f = u.find_spec("cudnn")
print(os.path.join(os.path.dirname(os.path.dirname(f.origin)), "include") if f and f.origin else "")
]=]
    OUTPUT_VARIABLE _ax_cd_out RESULT_VARIABLE _ax_cd_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(_ax_cudnn_dir "")
  set(_ax_cfe_include "${AX_CUDNN_FRONTEND_INCLUDE}")
  if(_ax_cd_rc EQUAL 0)
    string(REPLACE "\n" ";" _ax_cd_out "${_ax_cd_out};;")
    list(GET _ax_cd_out 0 _ax_cudnn_dir)
    if(NOT _ax_cfe_include)
      list(GET _ax_cd_out 1 _ax_cfe_include)
    endif()
  endif()
  if(_ax_cudnn_dir AND EXISTS "${_ax_cudnn_dir}/include/cudnn.h" AND EXISTS "${_ax_cudnn_dir}/lib/libcudnn.so.9"
     AND _ax_cfe_include AND EXISTS "${_ax_cfe_include}/cudnn_frontend.h")
    set(AXENGINE_HAVE_CUDNN_ATTENTION ON)
    target_include_directories(ax_cudnn_attention SYSTEM INTERFACE "${_ax_cfe_include}" "${_ax_cudnn_dir}/include")
    # nvrtc: the frontend's plan code also carries its run-time-compiled engines (never used by our graphs).
    target_link_libraries(ax_cudnn_attention INTERFACE "${_ax_cudnn_dir}/lib/libcudnn.so.9" CUDA::nvrtc)
    target_compile_definitions(ax_cudnn_attention INTERFACE AXENGINE_WITH_CUDNN_ATTENTION)
    message(STATUS "axengine: cuDNN attention ON (cudnn at ${_ax_cudnn_dir}, frontend at ${_ax_cfe_include})")
  elseif(AXENGINE_WITH_CUDNN_ATTENTION STREQUAL "ON")
    message(FATAL_ERROR "axengine: AXENGINE_WITH_CUDNN_ATTENTION=ON but the cuDNN headers/library (${_ax_cudnn_dir}) or "
                        "cudnn_frontend.h (${_ax_cfe_include}) were not found (scripts/setup.sh installs the wheels)")
  else()
    message(STATUS "axengine: cuDNN attention OFF (no nvidia-cudnn / nvidia-cudnn-frontend found through ${AXENGINE_PYTHON})")
  endif()
else()
  message(STATUS "axengine: cuDNN attention OFF (AXENGINE_WITH_CUDNN_ATTENTION=OFF)")
endif()
