# Sourced by the scripts: where things live. Override any of these from the environment.
: "${AXENGINE_VENV:=$HOME/.cache/axengine/venv}"      # virtualenv holding the torch wheel (outside the checkout)
: "${AXENGINE_BUILD:=build}"                          # build directory, relative to the repository root
export AXENGINE_VENV AXENGINE_BUILD
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
