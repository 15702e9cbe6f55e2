# The GPU architectures the CUDA kernels are compiled for (docs/gpu.md, "CUDA architectures").
#
# Each architecture is a full compile of every kernel (ptxas is most of the CUDA build time), so the default is
# what this machine can run:
#   - a machine with GPUs (nvidia-smi): their compute capabilities, as real code; Hopper (9.0) as 90a, because
#     the wgmma/TMA kernels (scattermoe's split path, sonicmoe) exist only in an sm_90a cubin;
#   - a machine without one (CI, a build host): sm_90a code and compute_80 PTX, which every newer GPU
#     compiles at load (the plugins then exist for a later GPU, and Hopper runs the fast paths).
# AXENGINE_CUDA_ARCHS widens it: "all" is the release set (sm_90a, sm_120 code, compute_80 PTX), any other value
# a CMAKE_CUDA_ARCHITECTURES list ("90a-real;100-real;80-virtual"). Read from the cache, or from the environment
# variable of the same name, which wins (so `AXENGINE_CUDA_ARCHS=all scripts/build.sh` works on a configured
# tree). CMAKE_CUDA_ARCHITECTURES given explicitly wins over both (the GPU machine's scripts set it).
# sonicmoe sets its own: sm_90a only (plugins/sonicmoe/CMakeLists.txt).

set(AX_CUDA_ARCHS_DEFAULT "90a-real;80-virtual")
set(AX_CUDA_ARCHS_ALL "90a-real;120-real;80-virtual")

# ax_cuda_archs_for(<out_var> CAPS <"9.0" ...> SUPPORTED <"sm_90a" "sm_120" ...> [REQUESTED <value>])
# The architecture list for GPUs of compute capabilities CAPS (nvidia-smi's compute_cap), given the real
# architectures the compiler supports (nvcc --list-gpu-code: sm_90, sm_120, ...; it lists no "a" variants) and AXENGINE_CUDA_ARCHS (REQUESTED). A pure function:
# tests/guard/cuda_archs_test.cmake checks it without nvcc or a GPU.
function(ax_cuda_archs_for out_var)
  cmake_parse_arguments(A "" "" "CAPS;SUPPORTED;REQUESTED" ${ARGN})  # REQUESTED: a list, itself
  if("${A_REQUESTED}" STREQUAL "all")
    set(${out_var} "${AX_CUDA_ARCHS_ALL}" PARENT_SCOPE)
    return()
  elseif(NOT "${A_REQUESTED}" STREQUAL "")
    set(${out_var} "${A_REQUESTED}" PARENT_SCOPE)
    return()
  endif()
  set(archs)
  foreach(cap IN LISTS A_CAPS)
    string(STRIP "${cap}" cap)
    if(NOT cap MATCHES "^([0-9]+)\\.([0-9])$")
      continue()
    endif()
    math(EXPR n "${CMAKE_MATCH_1} * 10 + ${CMAKE_MATCH_2}")
    if(n LESS 80)  # the kernels need sm_80 (bf16 mma.sync, cp.async): nothing of this GPU runs them
      continue()
    endif()
    # A GPU newer than this nvcc knows: no code of its own; the PTX of the default runs there.
    if(NOT "sm_${n}" IN_LIST A_SUPPORTED)
      continue()
    endif()
    set(arch "${n}")
    if(n EQUAL 90)
      set(arch "90a")
    endif()
    list(APPEND archs "${arch}-real")
  endforeach()
  list(REMOVE_DUPLICATES archs)
  if(NOT archs)
    set(archs "${AX_CUDA_ARCHS_DEFAULT}")
  endif()
  set(${out_var} "${archs}" PARENT_SCOPE)
endfunction()

# ax_choose_cuda_archs(): sets CMAKE_CUDA_ARCHITECTURES (before enable_language(CUDA)) unless it was given.
function(ax_choose_cuda_archs)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    message(STATUS "axengine: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (CMAKE_CUDA_ARCHITECTURES)")
    return()
  endif()
  if(DEFINED ENV{AXENGINE_CUDA_ARCHS})
    set(AXENGINE_CUDA_ARCHS "$ENV{AXENGINE_CUDA_ARCHS}" CACHE STRING "" FORCE)
  endif()
  set(caps)
  set(supported)
  if("${AXENGINE_CUDA_ARCHS}" STREQUAL "")
    find_program(AX_NVIDIA_SMI nvidia-smi)
    mark_as_advanced(AX_NVIDIA_SMI)
    if(AX_NVIDIA_SMI)
      execute_process(COMMAND ${AX_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
        OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 30)
      if(NOT rc EQUAL 0)
        set(caps)
      endif()
      string(REPLACE "\n" ";" caps "${caps}")
    endif()
    execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-code
      OUTPUT_VARIABLE supported ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    string(REPLACE "\n" ";" supported "${supported}")
  endif()
  ax_cuda_archs_for(archs CAPS ${caps} SUPPORTED ${supported} REQUESTED ${AXENGINE_CUDA_ARCHS})
  if(NOT "${AXENGINE_CUDA_ARCHS}" STREQUAL "")
    set(why "AXENGINE_CUDA_ARCHS=${AXENGINE_CUDA_ARCHS}")
  elseif(caps)
    string(REPLACE ";" ", " shown "${caps}")
    set(why "this machine's GPUs: compute capability ${shown}; AXENGINE_CUDA_ARCHS=all for the release set")
  else()
    set(why "no GPU here: sm_90a + PTX for newer GPUs; AXENGINE_CUDA_ARCHS=all for the release set")
  endif()
  message(STATUS "axengine: CUDA architectures ${archs} (${why})")
  set(CMAKE_CUDA_ARCHITECTURES "${archs}" PARENT_SCOPE)
endfunction()

set(AXENGINE_CUDA_ARCHS "" CACHE STRING
  "CUDA architectures: empty = this machine's GPUs (else sm_90a + compute_80 PTX), all = 90a-real;120-real;80-virtual, or a CMAKE_CUDA_ARCHITECTURES list")
