"""A short real capture of the tiny model, shared by the tests that read a trace; the
same job's command-line options, and a runner, for the multi-rank captures."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from layercheck.contract.trace import Trace, read_trace  # noqa: E402
from profiler.capture import capture  # noqa: E402
from profiler.config import CaptureConfig  # noqa: E402
from profiler.launch import torchrun_command  # noqa: E402
from tests.layercheck.torchrun import failure  # noqa: E402

TINY = dict(model="tiny", steps=14, batch_size=4, seq_len=32, warmup_steps=3, smax=8,
            threads=1, eval_sequences=8)
JOB = ["--model", "tiny", "--steps", str(TINY["steps"]), "--batch-size", str(TINY["batch_size"]),
       "--seq-len", str(TINY["seq_len"]), "--warmup-steps", str(TINY["warmup_steps"]),
       "--smax", str(TINY["smax"]), "--threads", "1", "--quiet", "--no-calibrate"]
"""``TINY`` as typed on the command line (no calibration: its own tests calibrate)."""
ROOT = Path(__file__).resolve().parents[2]


def run_command(command: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``command`` from the repository root as a user would (no DS_ACCELERATOR, no
    OMP_NUM_THREADS, no torchrun variables: the profiler must cope); AssertionError
    unless it exits 0."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DS_ACCELERATOR", "OMP_NUM_THREADS", "LOCAL_RANK", "WORLD_SIZE")}
    done = subprocess.run(command, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT),
                                                  "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, failure(done)
    return done


def assert_trains_the_plain_job(trace, plain) -> None:
    """A multi-rank capture of the tiny model recorded the plain capture's job: the
    same layers and learning rates, and the same numbers up to float rounding (a
    wrong gradient, such as DeepSpeed's default clipping at norm 1 or both ranks on
    the same rows, shows from step 2 or 3 on at ~1e-3; rounding stays below 1e-6),
    so the same writes."""
    import numpy as np
    assert trace.layer_names == plain.layer_names
    np.testing.assert_allclose(trace.steps["lr"], plain.steps["lr"], rtol=1e-12)
    np.testing.assert_allclose(trace.steps["loss"], plain.steps["loss"], atol=2e-5)
    np.testing.assert_allclose(trace.drift_matrix(), plain.drift_matrix(), rtol=1e-4)
    assert np.array_equal(trace.write_matrix(), plain.write_matrix())


class Captured(NamedTuple):
    path: Path
    trace: Trace


def torchrun_capture(out: Path, *options: str) -> Captured:
    """``torchrun --nproc_per_node 2 -m profiler capture <options> <JOB> --out <out>``,
    typed by hand (a test module's fixture, run once); rank 0 alone says that it
    wrote the trace. The folder and the trace read back."""
    done = run_command(torchrun_command(["capture", *options, *JOB, "--out", str(out)], 2))
    assert done.stdout.count(f"wrote {out}") == 1
    return Captured(out, read_trace(out))


@pytest.fixture(scope="session")
def tiny_capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "tiny"
    return capture(CaptureConfig(**TINY), out=out, progress=False, say=lambda _: None,
                   calibrate=False)


BUDGET_STEPS = 80
"""Steps of ``budget_capture``: enough for the write budget's controller to act."""


class Budgeted(NamedTuple):
    path: Path
    trace: Trace
    config: object
    """The LayerCheckConfig the run was given."""


@pytest.fixture(scope="session")
def budget_capture(tiny_capture, tmp_path_factory):
    """The tiny job in budget mode (``LayerCheckConfig.write_budget``: half the bytes
    per step the free run wrote after its base checkpoint), over ``BUDGET_STEPS``."""
    from layercheck import LayerCheckConfig
    free = tiny_capture.trace
    per_step = free.writes.loc[free.writes["reason"] != "base", "bytes"].sum() / (TINY["steps"] - 3)
    lc = LayerCheckConfig(base_threshold=1e-3, embedding_threshold=1e-2, warmup_steps=3,
                          smax=30, write_budget=0.5 * per_step)
    config = CaptureConfig(**{**TINY, "steps": BUDGET_STEPS, "warmup_steps": None, "smax": None},
                           layercheck=lc.to_dict())
    done = capture(config, out=tmp_path_factory.mktemp("traces") / "budget", progress=False,
                   say=lambda _: None, calibrate=False)
    return Budgeted(done.path, done.trace, lc)


@pytest.fixture(scope="session")
def calibrated_tiny(tiny_capture, tmp_path_factory):
    """A copy of the tiny capture with its costs.json, by
    ``python -m profiler calibrate --trace`` (one repeat per figure)."""
    import shutil

    from profiler.cli import main
    folder = tmp_path_factory.mktemp("calibrated") / "tiny"
    shutil.copytree(tiny_capture.path, folder)
    assert main(["calibrate", "--trace", str(folder), "--repeats", "1", "--quiet"]) == 0
    return folder
