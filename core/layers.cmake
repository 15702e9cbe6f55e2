# Which of the three libraries each file of core/ belongs to (docs/architecture.md, "Layers"): the one place
# the split is written down. Read by core/CMakeLists.txt (what each library compiles), by the fuzz-only build
# (tests/fuzz) and by the direction test (tests/guard/check_layers.cmake).
#
#   core        (libaxengine.so, axengine::core)            the mechanism, what a plugin links
#   builtins    (libaxengine_builtins.so, axengine::builtins) what core itself provides through the registry
#   conformance (libaxengine_conformance.so, axengine::conformance) the suite that certifies backends
#
# By directory, so a new file lands in its directory's library without a CMake edit; a file whose directory
# says the wrong thing is listed by name. Paths are relative to core/src (sources) or core/include (headers).

# Directories of core/src whose files are built-ins.
set(AX_LAYER_BUILTINS_DIRS models data jinja tokenizer train ops/reference ops/quant ops/aten)
# Files outside those directories that are built-ins:
#   builtins.cpp — registers the built-ins;
#   engine.cpp   — Engine::start registers the built-ins before the plugins (built-ins first, so a plugin
#                  cannot shadow one), and resolve_all() knows what the built-in decoder calls. Engine is the
#                  host's composition of mechanism and built-ins, not mechanism a plugin links.
set(AX_LAYER_BUILTINS_FILES builtins.cpp engine.cpp)
# Files inside the built-in directories that are mechanism: code of the interfaces a plugin implements or
# calls, which a plugin linking only axengine::core must find.
#   data/batch.cpp           — Batch::to (model.hpp), DatasetType::collate and collate_per_token_extras
#                              (dataset.hpp): the default of a dataset type's virtual, in every plugin type's vtable;
#   data/stream_rows.cpp     — the JSON Lines shard stream of stream.hpp, which plugin types (mm_cpt) stream through;
#   data/chat_media.cpp      — the key functions of chat_media.hpp's interfaces, which plugin types (mm_cpt) implement;
#   train/optimizer_step.cpp — Optimizer::step(lr, found_inf) (optimizer.hpp), the default of a virtual;
#   ops/quant/quant.cpp      — the weight formats in code (ops/quant.hpp, ops/fp8.hpp): nf4 / mxfp4 / nvfp4
#                              packing and decoding, fp8 decoding and quantize_fp8_blocks, used by plugins (their tests, packed-weight backends), conformance,
#                              the reference backends and the model loaders alike; and the helpers of the
#                              Quantizer interface (quantize_misfit, weight_bytes of ops/quantizer.hpp).
#                              ops/quant/quantizer.cpp, the reference quantizer, stays a built-in.
set(AX_LAYER_CORE_FILES data/batch.cpp data/stream_rows.cpp data/chat_media.cpp train/optimizer_step.cpp ops/quant/quant.cpp)
# Directories of core/src whose files are the conformance library.
set(AX_LAYER_CONFORMANCE_DIRS conformance)

# Public headers (core/include/axengine/) that belong to a library other than core: a mechanism file may not
# include them. The others are the interfaces and the mechanism (some declare a function built-ins define,
# e.g. check_model in model_check.hpp beside the ModelFamilyCheck interface: the link catches those calls).
set(AX_LAYER_BUILTINS_HEADERS axengine/builtins.hpp axengine/engine.hpp axengine/generation.hpp axengine/hf_tokenizer.hpp
  axengine/models.hpp axengine/training.hpp)
set(AX_LAYER_CONFORMANCE_HEADERS axengine/conformance.hpp axengine/op_conformance.hpp)

# ax_core_layer(<path relative to core/src> <out_var>): core, builtins or conformance.
function(ax_core_layer rel out_var)
  set(layer core)
  foreach(d IN LISTS AX_LAYER_BUILTINS_DIRS)
    if(rel MATCHES "^${d}/")
      set(layer builtins)
    endif()
  endforeach()
  foreach(d IN LISTS AX_LAYER_CONFORMANCE_DIRS)
    if(rel MATCHES "^${d}/")
      set(layer conformance)
    endif()
  endforeach()
  if(rel IN_LIST AX_LAYER_BUILTINS_FILES)
    set(layer builtins)
  elseif(rel IN_LIST AX_LAYER_CORE_FILES)
    set(layer core)
  endif()
  set(${out_var} ${layer} PARENT_SCOPE)
endfunction()

# ax_core_header_layer(<include path as written, e.g. axengine/engine.hpp> <out_var>): the library of a public header.
function(ax_core_header_layer inc out_var)
  set(layer core)
  if(inc IN_LIST AX_LAYER_BUILTINS_HEADERS)
    set(layer builtins)
  elseif(inc IN_LIST AX_LAYER_CONFORMANCE_HEADERS)
    set(layer conformance)
  endif()
  set(${out_var} ${layer} PARENT_SCOPE)
endfunction()

# ax_core_sources(<layer> <out_var> [FROM <paths relative to core/src>]): the .cpp files of core/src in <layer>,
# as absolute paths; FROM restricts them to a given list (the fuzz-only build). Without FROM: every .cpp of
# core/src except the logging facade (its own static library) and conformance/cuda (chosen by CUDA).
function(ax_core_sources layer out_var)
  cmake_parse_arguments(A "" "" "FROM" ${ARGN})
  set(src ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/src)
  if(A_FROM)
    set(rels ${A_FROM})
  else()
    file(GLOB_RECURSE rels CONFIGURE_DEPENDS RELATIVE ${src} ${src}/*.cpp)
    list(FILTER rels EXCLUDE REGEX "^log/|^conformance/cuda/")
  endif()
  set(out)
  foreach(r IN LISTS rels)
    ax_core_layer(${r} l)
    if(l STREQUAL layer)
      list(APPEND out ${src}/${r})
    endif()
  endforeach()
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
