"""examples/finetune_tiny.py as a user first runs it: progress, a final line that says
where the checkpoint is, how big, how to inspect it; a directory kept bounded; and the
library's notice when a run starts with every version kept."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from layercheck import LayerCheckConfig
from layercheck.tools.inspection import format_size, inspect_directory
from layercheck.storage.localstore import LocalStore
from tests.conftest import checkpointed_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "finetune_tiny.py"
LAYERS = 6  # the example's model: embedding (tied head), 4 blocks, norm


def _run(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_example_says_what_it_does_and_keeps_its_directory_bounded(tmp_path):
    ckpt = tmp_path / "ckpt"
    lines = _run("--ckpt", str(ckpt), "--steps", "40", "--warmup-steps", "4", "--smax", "20",
                 "--threshold", "1e-4").stdout.strip().splitlines()
    assert lines[0] == f"training 40 steps, checkpointing into {ckpt}"
    assert [int(re.match(r"step (\d+)/40  loss \d", line).group(1)) for line in lines[1:-1]] == \
        list(range(4, 41, 4))
    info = inspect_directory(LocalStore(ckpt, create=False), verify=False)
    size = format_size(info["bytes_on_disk"])
    assert lines[-1] == (f"checkpoint {ckpt}: step 40 recoverable, {size} on disk "
                         f"({info['layer_versions']:,} layer versions); inspect it: "
                         f"python -m layercheck inspect {ckpt}")
    # every layer written at (nearly) every step, yet each keeps 2 versions and its base
    assert info["layer_versions"] <= 3 * LAYERS
    assert sum(p.stat().st_size for p in ckpt.rglob("*.safetensors")) == info["bytes_on_disk"]


def test_a_run_that_keeps_every_version_says_how_to_bound_it(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="layercheck"):
        checkpointed_run(tmp_path / "all", LayerCheckConfig(warmup_steps=2, smax=10), 3)
    said = [r.getMessage() for r in caplog.records if r.name == "layercheck"]
    assert said == [f"layercheck: {tmp_path / 'all'} keeps every layer version written "
                    "(keep_versions=None), so it grows with every write: bound it with "
                    "LayerCheckConfig(keep_versions=2) (each layer keeps its 2 newest versions "
                    "and its base copy; the newest step stays recoverable), or prune it later "
                    f"with `python -m layercheck gc {tmp_path / 'all'}`"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="layercheck"):  # said when the run started
        checkpointed_run(tmp_path / "all", LayerCheckConfig(warmup_steps=2, smax=10), 1)
    assert [r for r in caplog.records if r.name == "layercheck"] == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="layercheck"):
        checkpointed_run(tmp_path / "bounded", LayerCheckConfig(warmup_steps=2, smax=10,
                                                                keep_versions=2), 3)
    assert [r for r in caplog.records if r.name == "layercheck"] == []
