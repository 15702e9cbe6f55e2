# ax_doctest_list(<exe> <workdir> <out_var>): the test case names of a doctest executable, one list entry
# each, with ';' inside a name replaced by <AX_SEMICOLON> (CMake lists split at ';'). Fails unless the
# number of names read equals the count doctest itself reports, so a change in doctest's listing format
# cannot silently drop cases. Used at build time (AxDoctestDiscover.cmake) and by the CTest guard.
function(ax_doctest_list exe workdir out_var)
  execute_process(COMMAND ${exe} --list-test-cases --no-version=true
    WORKING_DIRECTORY ${workdir} OUTPUT_VARIABLE listing ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${exe} --list-test-cases failed (${rc}):\n${err}")
  endif()
  string(REPLACE ";" "<AX_SEMICOLON>" listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(names)
  set(expected "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^\\[doctest\\] unskipped test cases passing the current filters: ([0-9]+)")
      set(expected ${CMAKE_MATCH_1})
    elseif(NOT line MATCHES "^\\[doctest\\]" AND NOT line MATCHES "^=+$" AND NOT line STREQUAL "")
      list(APPEND names "${line}")
    endif()
  endforeach()
  list(LENGTH names n)
  if(expected STREQUAL "" OR NOT n EQUAL expected)
    message(FATAL_ERROR "${exe}: read ${n} test case names but doctest reports '${expected}':\n${listing}")
  endif()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()
