# ax_doctest_add_tests(<target> [WORKING_DIRECTORY dir] [LABELS l...]): one CTest entry per doctest case of
# <target>, named exactly as the case.
#
# Why not doctest's own doctest_discover_tests: it handles the names as CMake lists, so a name with ';' was
# split into pieces whose --test-case filters matched nothing, and doctest exits 0 when nothing runs — those
# entries passed without running a case. Here the names are written as bracket arguments (never split), the
# filter escapes what doctest's filter syntax treats specially (',' and '\'), and every entry passes
# --ax-expect=<name> so the test main (tests/unit/main.cpp) fails unless exactly that one case ran.
set(_AX_DOCTEST_DISCOVER ${CMAKE_CURRENT_LIST_DIR}/AxDoctestDiscover.cmake)

function(ax_doctest_add_tests target)
  cmake_parse_arguments(A "" "WORKING_DIRECTORY" "LABELS" ${ARGN})
  if(NOT A_WORKING_DIRECTORY)
    set(A_WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}_ctest.cmake)
  # Discovered after each build (running the executable with --list-test-cases); CTest includes the result.
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DOUT=${out} -DWORKDIR=${A_WORKING_DIRECTORY}
            "-DLABELS=${A_LABELS}" -P ${_AX_DOCTEST_DISCOVER}
    BYPRODUCTS ${out} VERBATIM)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${out})
endfunction()
