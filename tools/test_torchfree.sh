#!/usr/bin/env bash
# The simulator's and the dashboard's tests in a virtual environment WITHOUT torch
# (.venv-notorch): a user exploring what-ifs must not need torch, so sim/ and
# dashboard/ must import and run without it. tools/test.sh (the README's test command) runs
# it after the torch suite: it is where tests/sim and tests/dashboard run.
#   bash tools/test_torchfree.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-notorch
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# the core, the dashboard, dask and numba (tests/sim/test_grid.py, test_kernel.py) and the
# test tools; no train extra, so no torch
"$VENV/bin/pip" install -q --disable-pip-version-check -c constraints.txt -e ".[dashboard,dev,distributed,sim-fast]"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "test_torchfree: torch is importable in $VENV; something pulled it in" >&2
    exit 1
fi
echo "test_torchfree: tests/sim and tests/dashboard in $VENV (no torch)"
"$VENV/bin/python" -m pytest -q -n auto --dist loadfile tests/sim tests/dashboard
