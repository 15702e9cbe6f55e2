# Sourced by the scripts: where things live. Override any of these from the environment.
: "${AXENGINE_VENV:=$HOME/.cache/axengine/venv}"      # virtualenv holding the torch wheel (outside the checkout)
: "${AXENGINE_BUILD:=build}"                          # build directory, relative to the repository root
export AXENGINE_VENV AXENGINE_BUILD
# ccache: shared across clones; precompiled headers need the sloppiness below to hit.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
