"""``python -m profiler drill``: the paper's recovery-fidelity experiment, for real.

1. The failure-free run: a capture (or an existing captured trace, ``--from``).
2. Failure steps: the step of highest parameter-weighted staleness of the
   failure-free run's checkpoint (one per window with ``--failures N``).
3. The failed run: a worker process trains the same job into a fresh
   LayerCheck directory; after failure step t is committed the drill kills
   it with SIGKILL; a new worker process restores the composite state from
   the directory, resumes at t+1 (no replay) and runs on to the next
   failure or the end.
4. ``drill.json``: failure steps, recovery seconds (plan + load + restore as
   measured by the new process), loss deviation of the recovered run from
   the failure-free run after the first failure (absolute and relative to
   the failure-free loss), final held-out metric of both, and both loss
   curves. The measured restores join the trace's ``recovery`` table.

Both runs see the same batches and, where the state is the same, compute
the same numbers: ``pre_failure_max_abs_deviation`` (expected 0) checks it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layercheck.contract.trace import Trace, TraceError, read_trace, write_trace

from ..capture import capture
from ..config import RANKED_CAPTURES, CaptureConfig, DrillConfig, ranked_capture
from ..errors import ProfilerError
from ..machine import resolve_device
from ..staleness import failure_steps
from .worker import EventReader, write_job

__all__ = ["drill", "DrillResult", "PAPER_FIDELITY", "plain_capture"]

PAPER_FIDELITY = {"max_abs_loss_deviation": 0.0024, "max_rel_loss_deviation": 0.0054,
                  "setup": "Qwen2.5-7B on OpenThoughts, 3 failures at step 299 (LayerCheck, "
                           "IEEE CLUSTER 2026)"}
POLL_S = 0.2


@dataclass(frozen=True)
class DrillResult:
    path: Path
    drill: dict[str, Any]
    summary: dict[str, Any]


def drill(config: DrillConfig | None, *, failures: int = 1, from_trace: Path | None = None,
          out: Path | None = None, progress: bool = True,
          argv: list[str] | None = None) -> DrillResult:
    """Run the drill (module doc); ``config`` is None when ``from_trace`` defines the job."""
    if from_trace is not None:
        trace, job = _load_failure_free(from_trace, failures)
        dest = Path(out) if out else Path(from_trace)
    else:
        assert config is not None
        # no calibration: the drill measures fidelity (`profiler calibrate` can follow)
        result = capture(config.capture, out=out, progress=progress, argv=argv, calibrate=False)
        trace, dest = result.trace, result.path
        job = DrillConfig(capture=CaptureConfig.from_dict(trace.manifest["sources"]["capture"]),
                          failures=config.failures)
    staleness = trace.weighted_staleness()
    steps = failure_steps(staleness, job.failures)
    device, _ = resolve_device(job.capture.device)
    failed = _failed_run(job.capture, device, steps, progress)
    doc = _drill_doc(trace, steps, staleness, failed, job)
    write_trace(dataclasses.replace(trace, recovery=_recovery(trace, failed), drill=doc), dest)
    return DrillResult(dest, doc, _summary(doc))


def _load_failure_free(path: Path, failures: int) -> tuple[Trace, DrillConfig]:
    trace, config = plain_capture(path, "a drill")
    return trace, DrillConfig(capture=config, failures=failures)


def plain_capture(path: Path, what: str) -> tuple[Trace, CaptureConfig]:
    """The trace at ``path`` and its job's settings, refused unless a plain capture made
    it (``what`` re-runs the job in one process and needs its evaluation)."""
    trace = read_trace(path)
    if trace.kind != "captured" or "capture" not in trace.manifest.get("sources", {}):
        raise ProfilerError(f"{path}: {what} needs a trace made by `python -m profiler "
                            "capture` (this one has no capture settings)")
    if "evaluation" not in trace.manifest:
        raise TraceError(f"{path}/manifest.json: no evaluation; re-capture it")
    ranked = ranked_capture(trace.manifest["sources"])
    if ranked:
        raise ProfilerError(f"{path}: {RANKED_CAPTURES[ranked]} capture; {what} re-runs the job "
                            "in a single process, so give it a plain capture (python -m profiler "
                            f"capture without --{ranked})")
    return trace, CaptureConfig.from_dict(trace.manifest["sources"]["capture"])


# -- the failed run -------------------------------------------------------------
@dataclass
class _FailedRun:
    losses: dict[int, float]
    restores: list[dict[str, Any]]
    restart_s: list[float]
    metric: float


def _failed_run(config: CaptureConfig, device: str, steps: list[int],
                progress: bool) -> _FailedRun:
    from tqdm import tqdm
    with tempfile.TemporaryDirectory(prefix="layercheck-drill-") as tmp:
        root = Path(tmp)
        log = root / "events.jsonl"
        bar = tqdm(total=config.steps, desc="drill: failed run", unit="step",
                   disable=not progress, mininterval=2.0, file=sys.stderr)
        reader = EventReader(log)
        killed_at: list[float] = []
        for i, halt in enumerate([*steps, None]):
            job = write_job(root / f"job{i}.json", config=config, device=device,
                            root=root / "ckpt", log=log, halt_at=halt)
            _run_segment(job, root / f"worker{i}.log", halt, reader, bar)
            if halt is not None:
                killed_at.append(time.time())
        bar.close()
        return _collect(reader.events, killed_at)


def _run_segment(job: Path, stderr_path: Path, halt: int | None, reader: EventReader,
                 bar: Any) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "profiler", "worker", str(job)],
                                stdout=err, stderr=subprocess.STDOUT, env=env)
        while True:
            for event in reader.poll():
                if event["event"] == "step":
                    bar.n = event["step"]
                    bar.refresh()
                if halt is not None and event["event"] == "halted" and event["step"] == halt:
                    os.kill(proc.pid, signal.SIGKILL)  # the failure
                    proc.wait()
                    return
            code = proc.poll()
            if code is not None:
                reader.poll()
                if code == 0 and halt is None:
                    return
                tail = stderr_path.read_text()[-2000:].strip().splitlines()[-5:]
                raise RuntimeError(f"drill worker exited with {code} before "
                                   f"{'step ' + str(halt) if halt else 'the end'}: "
                                   + " | ".join(tail))
            time.sleep(POLL_S)


def _collect(events: list[dict[str, Any]], killed_at: list[float]) -> _FailedRun:
    losses: dict[int, float] = {}
    starts = [e for e in events if e["event"] == "resumed"]
    for e in events:
        if e["event"] == "step":
            losses[e["step"]] = e["loss"]  # a replayed step (if any) keeps its newest loss
    done = [e for e in events if e["event"] == "done"]
    if not done:
        raise RuntimeError("the failed run ended without its final evaluation")
    restores = starts[1:]
    restart = [s["time"] - k for s, k in zip(restores, killed_at)]
    return _FailedRun(losses=losses, restores=restores, restart_s=restart,
                      metric=float(done[-1]["metric"]))


# -- results ------------------------------------------------------------------------
def _drill_doc(trace: Trace, steps: list[int], staleness: np.ndarray, failed: _FailedRun,
               job: DrillConfig) -> dict[str, Any]:
    n = trace.num_steps
    free = trace.steps["loss"].to_numpy(dtype=np.float64)
    missing = [t for t in range(1, n + 1) if t not in failed.losses]
    if missing:
        raise RuntimeError(f"the failed run has no loss for steps {missing[:5]}")
    recovered = np.array([failed.losses[t] for t in range(1, n + 1)], dtype=np.float64)
    after = np.arange(1, n + 1) > steps[0]
    dev = np.abs(recovered - free)
    rel = dev / np.abs(free)
    evaluation = trace.manifest["evaluation"]
    return {
        "failure_steps": steps,
        "recovery_seconds": [r["plan_s"] + r["load_s"] + r["restore_s"] for r in failed.restores],
        "max_abs_loss_deviation": float(dev[after].max()) if after.any() else 0.0,
        "max_rel_loss_deviation": float(rel[after].max()) if after.any() else 0.0,
        "final_metric": {"name": evaluation["name"], "failure_free": float(evaluation["value"]),
                         "recovered": failed.metric},
        "curves": {"step": list(range(1, n + 1)), "failure_free": free.tolist(),
                   "recovered": recovered.tolist()},
        "pre_failure_max_abs_deviation": float(dev[~after].max()) if (~after).any() else 0.0,
        "mean_abs_loss_deviation": float(dev[after].mean()) if after.any() else 0.0,
        "restored_steps": [int(r["restored"]) for r in failed.restores],
        "recoveries": [{k: r[k] for k in ("restored", "plan_s", "load_s", "restore_s", "bytes")}
                       for r in failed.restores],
        "restart_seconds": failed.restart_s,
        "weighted_staleness_at_failure": [float(staleness[t - 1]) for t in steps],
        "max_weighted_staleness": float(np.nanmax(staleness)),
        "failures": job.failures,
        "method": ("failure-free run vs a run SIGKILLed after each failure step's checkpoint "
                   "committed and recovered by a new process from the LayerCheck directory; "
                   "deviations over the steps after the first failure, relative to the "
                   "failure-free loss"),
        "paper": PAPER_FIDELITY,
    }


def _recovery(trace: Trace, failed: _FailedRun) -> pd.DataFrame:
    rows = pd.DataFrame([{"step": r["restored"], "plan_s": r["plan_s"], "load_s": r["load_s"],
                          "restore_s": r["restore_s"], "bytes": r["bytes"]}
                         for r in failed.restores])
    earlier = trace.recovery
    if earlier is not None and trace.drill is not None:  # replace an older drill's rows
        earlier = earlier.iloc[:len(earlier) - len(trace.drill.get("recoveries", []))]
    frames = [f for f in (earlier, rows) if f is not None and not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else None  # type: ignore[return-value]


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    keys = ("failure_steps", "restored_steps", "recovery_seconds", "restart_seconds",
            "max_abs_loss_deviation", "max_rel_loss_deviation", "mean_abs_loss_deviation",
            "pre_failure_max_abs_deviation", "weighted_staleness_at_failure", "final_metric")
    return {k: doc[k] for k in keys}
