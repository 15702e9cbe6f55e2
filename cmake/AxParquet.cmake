# Parquet data files through the Arrow C++ libraries of the pyarrow wheel (Arrow C++ is not packaged in Debian;
# the wheel ships libarrow/libparquet and their headers, the way the torch wheel ships LibTorch). Located through
# AXENGINE_PYTHON like torch (cmake/AxTorch.cmake).
#
# AXENGINE_WITH_PARQUET: AUTO (default) builds Parquet support when that python imports pyarrow, and goes
# without it otherwise (a machine without network or pyarrow still builds; a .parquet dataset then stops with
# "built without Parquet support"); ON requires it; OFF never builds it.
# Defines the INTERFACE target ax_parquet (empty without Parquet) and AXENGINE_HAVE_PARQUET.
set(AXENGINE_WITH_PARQUET AUTO CACHE STRING "Parquet dataset files via pyarrow's Arrow C++ libraries: AUTO, ON, OFF")
set_property(CACHE AXENGINE_WITH_PARQUET PROPERTY STRINGS AUTO ON OFF)
add_library(ax_parquet INTERFACE)
set(AXENGINE_HAVE_PARQUET OFF)
if(NOT AXENGINE_WITH_PARQUET STREQUAL "OFF")
  execute_process(
    COMMAND ${AXENGINE_PYTHON} -c
      "import pyarrow as pa; print(pa.get_include()); print(pa.get_library_dirs()[0]); print(pa.__version__)"
    OUTPUT_VARIABLE _ax_pa_out RESULT_VARIABLE _ax_pa_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_ax_pa_rc EQUAL 0)
    string(REPLACE "\n" ";" _ax_pa_out "${_ax_pa_out}")
    list(GET _ax_pa_out 0 _ax_pa_include)
    list(GET _ax_pa_out 1 _ax_pa_libdir)
    list(GET _ax_pa_out 2 _ax_pa_version)
    # The wheel ships only the versioned names (libarrow.so.2600), no libarrow.so link: link those files.
    file(GLOB _ax_arrow_lib "${_ax_pa_libdir}/libarrow.so.[0-9]*")
    file(GLOB _ax_parquet_lib "${_ax_pa_libdir}/libparquet.so.[0-9]*")
    list(FILTER _ax_arrow_lib EXCLUDE REGEX "\\.so\\.[0-9]+\\.")  # the SONAME file, not libarrow.so.2600.1.0
    list(FILTER _ax_parquet_lib EXCLUDE REGEX "\\.so\\.[0-9]+\\.")
    # 19: the arrow::Result form of parquet::arrow::OpenFile that data/parquet.cpp calls.
    if(_ax_pa_version VERSION_LESS 19)
      message(STATUS "axengine: pyarrow ${_ax_pa_version} is older than 19, whose Arrow C++ API data/parquet.cpp uses")
    elseif(_ax_arrow_lib AND _ax_parquet_lib AND EXISTS "${_ax_pa_include}/parquet/arrow/reader.h")
      set(AXENGINE_HAVE_PARQUET ON)
      target_include_directories(ax_parquet SYSTEM INTERFACE ${_ax_pa_include})
      target_link_libraries(ax_parquet INTERFACE ${_ax_parquet_lib} ${_ax_arrow_lib})
      target_compile_definitions(ax_parquet INTERFACE AXENGINE_WITH_PARQUET)
      message(STATUS "axengine: Parquet ON (pyarrow ${_ax_pa_version} at ${_ax_pa_libdir})")
    endif()
  endif()
  if(NOT AXENGINE_HAVE_PARQUET)
    if(AXENGINE_WITH_PARQUET STREQUAL "ON")
      message(FATAL_ERROR "axengine: AXENGINE_WITH_PARQUET=ON but ${AXENGINE_PYTHON} has no pyarrow with its Arrow C++ "
                          "libraries and headers (scripts/setup.sh installs it)")
    endif()
    message(STATUS "axengine: Parquet OFF (${AXENGINE_PYTHON} has no pyarrow; .parquet datasets are refused)")
  endif()
else()
  message(STATUS "axengine: Parquet OFF (AXENGINE_WITH_PARQUET=OFF)")
endif()
