// The source of the precompiled-header targets (core/CMakeLists.txt axengine_pch, plugins/CMakeLists.txt
// axengine_plugin_pch): they exist to build one PCH that other targets reuse; this file compiles to nothing.
