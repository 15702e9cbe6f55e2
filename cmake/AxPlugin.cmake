# axengine_add_plugin(<name> SOURCES ... [OUTPUT_DIR dir])
# Builds a plugin shared library `axengine_<name>.so` that links the core (for the interfaces and the
# registry) and LibTorch, nothing else of axengine: a plugin that defines its own op adds
# axengine::conformance for the checks of op_conformance.hpp (docs/plugins.md). The descriptor itself lives
# in the sources (AXENGINE_PLUGIN_DESCRIPTOR).
# Used for the project's own plugins and, through the installed SDK (find_package(axengine)), by third
# parties.
function(axengine_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES" ${ARGN})
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE axengine::core)
  # In the project's own build (AxSanitize.cmake): every symbol must resolve at link time, which proves the
  # plugin needs core (and what it links itself) only. Not set for SDK users.
  if(AXENGINE_NO_UNDEFINED_LINK)
    target_link_options(${name} PRIVATE ${AXENGINE_NO_UNDEFINED_LINK})
  endif()
  set_target_properties(${name} PROPERTIES
    PREFIX "" OUTPUT_NAME "axengine_${name}"
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  elseif(DEFINED AXENGINE_PLUGIN_OUTPUT_DIR)
    # The project's own plugins: beside the executable in the build tree, and installed there too.
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${AXENGINE_PLUGIN_OUTPUT_DIR})
    install(TARGETS ${name} LIBRARY DESTINATION bin/plugins)
    set_property(GLOBAL APPEND PROPERTY AXENGINE_PROJECT_PLUGINS ${name})  # -> the axengine_app target
  endif()
endfunction()
