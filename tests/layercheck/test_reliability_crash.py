"""The crash harness in CI: a few SIGKILLs at random moments, and proof it can fail.

The full run (>= 200 trials) is ``python benchmarks/bench_crash.py``; its
figures are in docs/reliability.md. Here every kill waits for the child's first
commit (``--kill-after-commit``): what each trial must recover does not depend
on how fast this machine trains.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_crash.py"


def _bench(tmp_path, *args):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-W", "ignore", str(BENCH), "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_random_sigkills_never_lose_a_committed_step(tmp_path):
    proc, result = _bench(tmp_path, "--trials", "6", "--seed", "7", "--max-delay", "1.0",
                          "--kill-after-commit")
    assert result["violations"] == 0, result["violation_examples"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(result["killed_while_main"].values()) == 6  # every child was killed, not done
    assert min(result["restored_steps"]) > 0  # every trial committed and recovered a step


@pytest.mark.slow
def test_random_sigkills_under_retention_and_warn_never_lose_a_committed_step(tmp_path):
    """Issue 13: the harness also runs with keep_versions=1 and on_error='warn', where
    retention retires versions and deletes their files at every step, and the
    manifest is compacted (at 16 KiB here): kills land there too."""
    proc, result = _bench(tmp_path, "--trials", "6", "--seed", "3", "--max-delay", "1.0",
                          "--kill-after-commit", "--retention")
    assert result["retention"] and result["violations"] == 0, result["violation_examples"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(result["killed_while_main"].values()) == 6
    assert min(result["restored_steps"]) > 0


@pytest.mark.slow
def test_the_harness_reports_a_store_that_lies(tmp_path):
    proc, result = _bench(tmp_path, "--trials", "3", "--seed", "7", "--sabotage",
                          "--kill-after-commit")
    assert proc.returncode == 1
    # trials 2 and 3 start past the base checkpoint, so they commit sabotaged heads
    assert result["violations"] >= 2
    assert any("fell back past damaged files" in v or "differs from the uninterrupted run" in v
               for v in result["violation_examples"])


COMPACTING_CHILD = r"""
import os, signal, sys
import torch
from layercheck import LayerCheck, LayerCheckConfig
from layercheck.storage import writer
from tests.conftest import optimizer_for, tiny_lm, train_step
root, when = sys.argv[1], sys.argv[2]
writer.COMPACT_BYTES = 8 << 10
rename = os.replace
def killing_replace(src, dst, *args, **kwargs):  # SIGKILL inside the manifest's compaction
    if str(dst).endswith("manifest.jsonl"):
        if when == "after rename":
            rename(src, dst, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(src, dst, *args, **kwargs)
os.replace = killing_replace
torch.manual_seed(0)
model = tiny_lm()
opt, sched = optimizer_for(model, total=200)
config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                          keep_versions=1, on_error="warn")
lc = LayerCheck(model, opt, root, config, scheduler=sched)
step = lc.restore()
while True:
    train_step(model, opt, sched)
    step += 1
    lc.step()
    lc.flush()
    print(step, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before rename", "after rename"])
def test_sigkill_during_manifest_compaction_loses_nothing(tmp_path, when, monkeypatch):
    """The writer compacts the manifest (issue 13) and the trainer is SIGKILLed in the
    middle: with the compacted copy written but not yet renamed over the manifest, or
    renamed but the folder not yet fsynced. Either manifest is whole: the step that
    was committed just before compaction restores, with no damage and nothing passed
    over, and training resumed there compacts again."""
    from layercheck import LayerCheck, LayerCheckConfig
    from layercheck.storage import writer
    from layercheck.storage.format import MANIFEST
    from layercheck.storage.manifest import read_manifest
    from layercheck.recovery import make_plan
    from layercheck.storage.localstore import LocalStore
    from tests.conftest import optimizer_for, tiny_lm, train_step
    root = tmp_path / "c"
    proc = subprocess.run([sys.executable, "-c", COMPACTING_CHILD, str(root), when],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -9, proc.stderr[-3000:]
    flushed = int(proc.stdout.split()[-1])
    store = LocalStore(root)
    view = read_manifest(store)
    # the records of step flushed+1 were appended, its retirement began the compaction
    assert (view.latest_step(), view.problems) == (flushed + 1, [])
    assert make_plan(store, view).warnings == []
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(".manifest.jsonl.")]
    if when == "before rename":
        assert store.size(MANIFEST) > 8 << 10 and len(leftovers) == 1
        gc = subprocess.run([sys.executable, "-m", "layercheck", "gc", str(root)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert gc.returncode == 0 and "(1 left by interrupted writes)" in gc.stdout, gc.stderr
        assert not (root / leftovers[0]).exists()  # and what follows restores as before
    else:
        assert store.size(MANIFEST) < 8 << 10 and leftovers == []
    monkeypatch.setattr(writer, "COMPACT_BYTES", 8 << 10)
    model = tiny_lm(seed=1)
    opt, sched = optimizer_for(model, total=200)
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                              keep_versions=1)
    with LayerCheck(model, opt, root, config, scheduler=sched) as lc:
        assert lc.restore() == flushed + 1 and lc.restored.plan.warnings == []
        for _ in range(40):
            train_step(model, opt, sched)
            lc.step()
    view = read_manifest(store)
    assert (view.latest_step(), view.problems) == (flushed + 41, [])
    assert store.size(MANIFEST) < 2 * (8 << 10)
