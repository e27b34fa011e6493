"""The dashboard imports and runs without torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["dashboard", "layercheck.contract.fastreplay", "layercheck.contract.replay_windows", "layercheck.contract.lanes",
           "layercheck.contract.budget", "dashboard.whatif", "dashboard.tuning", "sim.frontier", "sim.tuning",
           "dashboard.driftmap", "dashboard.fidelity", "dashboard.mtbf", "dashboard.catalog",
           "dashboard.downloads", "dashboard.ui", "dashboard.scale", "dashboard.myjob",
           "dashboard.tables", "dashboard.charts", "dashboard.verdict"]


def test_no_module_imports_torch():
    code = ("import sys\n"
            f"for m in {MODULES!r}: __import__(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
            " or m in ('layercheck.checkpoint', 'layercheck.backends.layermap'))\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_views_run_with_torch_blocked(tmp_path):
    """Every view runs (AppTest) in a process where importing torch fails."""
    code = f"""
import sys, os
sys.path.insert(0, {str(ROOT / 'tests' / 'dashboard')!r})
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
from conftest import make_trace
from layercheck.contract.trace import write_trace
root = {str(tmp_path)!r}
write_trace(make_trace(steps=120), root + "/t")
os.environ["LAYERCHECK_TRACES"] = root
from streamlit.testing.v1 import AppTest
for view in ("myjob", "drift", "whatif", "fidelity", "traces", "failures", "scale"):
    at = AppTest.from_file({str(ROOT / 'dashboard' / 'views')!r} + "/" + view + ".py", default_timeout=180)
    if view == "failures":
        at.session_state["seeds"] = 2
        at.session_state["window_d"] = 1
    if view == "myjob":
        at.session_state["job_seeds"] = 2
        at.session_state["job_window_d"] = 1.0
    if view == "scale":
        at.session_state["scale_seeds"] = 2
        at.session_state["scale_window_d"] = 1
        at.session_state["scale_gpus"] = (8, 16)
    at.run()
    assert not at.exception, (view, [e.value for e in at.exception])
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
