# CTest script (cmake -P): install this build to a temporary prefix, build examples/plugin_minimal OUT OF
# TREE against it with find_package(axengine), and certify the result with the INSTALLED
# `axengine conformance --plugin`. Proves the SDK (headers, axengine::core, AxTorch/AxPlugin) is complete, and
# that the package exports all three libraries (axengine::core, axengine::conformance, axengine::builtins).
# Inputs: BUILD_DIR SOURCE_DIR WORK_DIR PYTHON GENERATOR [LAUNCHER]
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR PYTHON GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "example_plugin_test: -D${v}=... is required")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f bin/axengine include/axengine/plugin.hpp include/axengine/ops/linear_lora.hpp include/axengine/op_conformance.hpp
          lib/libaxengine.so lib/libaxengine_conformance.so lib/libaxengine_builtins.so
          lib/cmake/axengine/axengineConfig.cmake lib/cmake/axengine/AxPlugin.cmake lib/cmake/axengine/AxTorch.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()
file(READ ${prefix}/lib/cmake/axengine/axengineTargets.cmake targets)
foreach(t core conformance builtins)
  if(NOT targets MATCHES "add_library\\(axengine::${t} SHARED IMPORTED\\)")
    message(FATAL_ERROR "the CMake package does not export axengine::${t}")
  endif()
endforeach()

set(launcher)
if(LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
run("configure example" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/plugin_minimal -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DAXENGINE_PYTHON=${PYTHON} ${launcher})
run("build example" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
set(plugin ${WORK_DIR}/build/axengine_minimal.so)
if(NOT EXISTS ${plugin})
  message(FATAL_ERROR "the example build did not produce ${plugin}")
endif()
run("conformance" ${prefix}/bin/axengine conformance --plugin ${plugin} --no-discover --quick --device cpu
    --report ${WORK_DIR}/conformance.xml)
message(STATUS "${last_output}")
file(READ ${WORK_DIR}/conformance.xml xml)
if(NOT xml MATCHES "linear.lora.minimal_lora.cpu" OR NOT xml MATCHES "failures=\"0\"")
  message(FATAL_ERROR "unexpected JUnit report:\n${xml}")
endif()
