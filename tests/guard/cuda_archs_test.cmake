# cmake -P: the CUDA architectures the build compiles for (cmake/AxCudaArchs.cmake, ax_cuda_archs_for), without nvcc
# or a GPU: the machine's GPUs as real code (Hopper as sm_90a), none -> sm_90a + compute_80 PTX, a GPU too old for the
# kernels or too new for the compiler -> the same default, AXENGINE_CUDA_ARCHS "all" or a list as given.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/AxCudaArchs.cmake)
set(nvcc13 sm_75 sm_80 sm_86 sm_87 sm_88 sm_89 sm_90 sm_100 sm_110 sm_103 sm_120 sm_121)
set(failures 0)
function(expect want)
  ax_cuda_archs_for(got ${ARGN})
  if(NOT got STREQUAL want)
    message(SEND_ERROR "ax_cuda_archs_for(${ARGN}) = '${got}', expected '${want}'")
  else()
    message(STATUS "ok: ${ARGN} -> ${got}")
  endif()
endfunction()
expect("90a-real;80-virtual" CAPS SUPPORTED ${nvcc13})                       # no GPU here (CI)
expect("90a-real" CAPS "9.0" SUPPORTED ${nvcc13})                            # an H100/H200
expect("90a-real" CAPS "9.0;9.0;9.0;9.0" SUPPORTED ${nvcc13})                # eight of them
expect("120-real" CAPS "12.0" SUPPORTED ${nvcc13})                           # an RTX 50xx
expect("89-real;90a-real" CAPS "8.9; 9.0" SUPPORTED ${nvcc13})               # mixed, nvidia-smi's spacing
expect("100-real" CAPS "10.0" SUPPORTED ${nvcc13})                           # a B200
expect("90a-real;80-virtual" CAPS "7.5" SUPPORTED ${nvcc13})                 # a T4: the kernels need sm_80
expect("90a-real;80-virtual" CAPS "15.0" SUPPORTED ${nvcc13})                # newer than nvcc: the PTX runs there
expect("90a-real;80-virtual" CAPS "[N/A]" SUPPORTED ${nvcc13})               # nvidia-smi without a usable answer
expect("90a-real;120-real;80-virtual" CAPS "9.0" SUPPORTED ${nvcc13} REQUESTED all)
expect("86-real;90a-real" CAPS SUPPORTED ${nvcc13} REQUESTED "86-real;90a-real")
