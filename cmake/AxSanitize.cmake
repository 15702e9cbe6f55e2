# Sanitizer and fuzzing builds (docs/testing.md).
#
# AXENGINE_SANITIZE: a comma-separated list of sanitizers, e.g. "address,undefined", compiled into every C/C++
# target of the project (CUDA sources are left alone: nvcc takes no -fsanitize) and linked into every binary.
# Any report is fatal (-fno-sanitize-recover), so a test that triggers one fails instead of printing and
# passing. LibTorch and the other prebuilt libraries are not instrumented: ASan still sees their heap through
# malloc, UBSan sees only our code. scripts/test.sh --sanitize builds and runs the CPU suite this way.
#
# AXENGINE_FUZZ: the libFuzzer harnesses of tests/fuzz (clang only). Our code is compiled with coverage for
# libFuzzer (-fsanitize=fuzzer-no-link) so the fuzzers see which branches an input reached. scripts/fuzz.sh
# configures it together with AXENGINE_SANITIZE=address,undefined in build-fuzz/.
set(AXENGINE_SANITIZE "" CACHE STRING "sanitizers for the CPU build, e.g. address,undefined (docs/testing.md)")
option(AXENGINE_FUZZ "Build the libFuzzer harnesses of tests/fuzz (clang)" OFF)

if(AXENGINE_SANITIZE)
  if(AXENGINE_HAVE_CUDA)
    message(STATUS "axengine: sanitizers apply to C/C++ sources only; CUDA kernels are built without them")
  endif()
  set(_ax_san -fsanitize=${AXENGINE_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_ax_san}>")
  add_link_options(-fsanitize=${AXENGINE_SANITIZE})
  message(STATUS "axengine: sanitizers ${AXENGINE_SANITIZE}")
endif()

if(AXENGINE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "AXENGINE_FUZZ needs clang (libFuzzer); configure with CXX=clang++-16 (scripts/fuzz.sh does)")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()

# AXENGINE_NO_UNDEFINED_LINK: the link option that makes a shared library or plugin resolve every symbol it uses in
# itself and what it links. The core libraries and the project's plugins use it to prove their dependencies
# point one way (docs/architecture.md, "Layers"). Empty under sanitizers or fuzzing: clang leaves the sanitizer
# runtime out of shared libraries (its symbols come from the executable).
set(AXENGINE_NO_UNDEFINED_LINK)
if(NOT AXENGINE_SANITIZE AND NOT AXENGINE_FUZZ)
  set(AXENGINE_NO_UNDEFINED_LINK -Wl,--no-undefined)
endif()
