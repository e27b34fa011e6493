"""The README as a new user meets it: the fastest first thing near the top, runnable in
seconds without torch; the dashboard's views named; dated timings left to docs/."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCK_TORCH = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
sys.argv = ["sim", *sys.argv[1:]]
runpy.run_module("sim", run_name="__main__")
"""


def test_the_first_command_is_the_simulator_and_runs_without_torch():
    intro = README.split("\n## ", 1)[0]  # before the first section
    first = re.search(r"```bash\n(.*?)\n```", intro, re.S)
    assert first, "no command before the README's first section"
    command = first.group(1).split("&&")[-1].split()
    assert command[:3] == ["python", "-m", "sim"], first.group(1)
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH, *command[3:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for strategy in ("layercheck", "deepspeed", "gemini"):  # a row of figures each
        assert re.search(rf"^{strategy}\s+\d", done.stdout, re.M), done.stdout


def test_the_dashboards_views_are_named():
    titles = re.findall(r'st\.Page\([^)]*title="([^"]+)"', (ROOT / "dashboard" / "app.py").read_text())
    assert len(titles) >= 6
    row = next(line for line in README.splitlines() if line.startswith("| `dashboard/` |"))
    assert [t for t in titles if t not in row] == [], row


def test_dated_timings_live_in_docs_not_in_the_readme():
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", README) == []
