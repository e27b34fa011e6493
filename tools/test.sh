#!/usr/bin/env bash
# The whole suite, each test once (what the README's test command and CI run):
# 1. everything but tests/sim and tests/dashboard in .venv (torch, DeepSpeed, real ranks);
# 2. tests/sim and tests/dashboard in a virtual environment WITHOUT torch
#    (tools/test_torchfree.sh): the simulator and the dashboard must not need it, so
#    they are tested where a user exploring what-ifs runs them.
# Both run even if the first fails; the exit status is non-zero if either failed.
# Extra arguments go to the first pytest (e.g. -x, -k NAME).
#   bash tools/test.sh
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
SECONDS=0
.venv/bin/python -m pytest -q -n auto --dist loadfile --ignore=tests/sim --ignore=tests/dashboard "$@" || status=1
echo "test: the torch suite done after ${SECONDS} s (status $status)"
bash tools/test_torchfree.sh || status=1
echo "test: the torch-free suite done after ${SECONDS} s (status $status)"
exit $status
