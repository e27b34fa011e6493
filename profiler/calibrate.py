"""Calibration: what each checkpointing strategy's mechanism costs on the capture's job and machine.

``calibrate_job`` runs every ``profiler.mechanisms`` measurement on a live
job (the end of ``capture``, or a job rebuilt from a trace by ``calibrate``)
in a scratch folder beside the checkpoints, and returns the
``layercheck.contract.calibration.Calibration`` that goes into ``costs.json``: every
figure with its source (measured, derived or assumed) and its method. A
collective on several ranks (rank 0 returns the calibration, the others None).

The stale cost factor (``stale_cost``) is measured by ``python -m profiler
staleness``, not here: a calibration keeps the one the trace's costs.json holds,
else carries the shipped capture's over by the trace's composition.

``python -m profiler calibrate --trace traces/X`` rebuilds X's job from its
manifest (the same model, data and settings; under ZeRO or FSDP2 the same
sharding and world size, started with torchrun), takes one training step so that the
optimizer state exists, and calibrates it.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layercheck.contract.calibration import Figure, write_calibration
from sim.calibrated import Calibration
from layercheck.contract.trace import Trace, read_trace
from sim.composite import embedding_share, transfer_stale_cost

from .config import CaptureConfig, ZeroConfig
from .errors import ProfilerError

__all__ = ["calibrate_job", "calibrate_trace", "job_spec", "REPEATS"]

REPEATS = 3
"""Timed repeats of each mechanism; the median is kept."""

MACHINE_KEYS = ("device", "cpu", "cpu_count", "threads", "torch", "python", "platform",
                "write_bytes_per_s", "read_bytes_per_s", "ranks", "threads_per_rank")


def calibrate_job(job: Any, trace: Trace | None, *, near: Path,
                  say: Callable[[str], None] = print,
                  repeats: int | None = None) -> Calibration | None:
    """Measure every figure on ``job`` (contract in the module doc). ``trace``: the
    job's trace (rank 0; the others may pass None); ``near``: a folder on the
    storage the checkpoints go to (scratch space is made and removed there)."""
    from .mechanisms import MECHANISMS, Bench, check_coverage, check_measured
    check_coverage(MECHANISMS)      # before minutes of measuring, not after
    repeats = REPEATS if repeats is None else repeats
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ProfilerError(f"repeats={repeats!r}: use an integer >= 1")
    ranks = job.ranks
    folder = Path(ranks.from_coordinator(
        tempfile.mkdtemp(prefix="layercheck-calibrate-", dir=near) if ranks.is_coordinator else None))
    bench = Bench(job=job, trace=trace, folder=folder, repeats=repeats, say=say)
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        for mechanism in MECHANISMS:
            began = time.perf_counter()
            bench.collective = mechanism.collective
            if mechanism.collective or ranks.is_coordinator:
                measured = mechanism.measure(bench)
                if ranks.is_coordinator:
                    check_measured(mechanism, measured)
                figures.update(measured)
            ranks.barrier()
            if ranks.is_coordinator:
                say(f"calibrated {mechanism.name} in {time.perf_counter() - began:.1f} s: "
                    f"{', '.join(mechanism.figures)}")
    finally:
        if ranks.is_coordinator:
            shutil.rmtree(folder, ignore_errors=True)
    if not ranks.is_coordinator:
        return None
    return _calibration(trace, figures, time.perf_counter() - started, repeats)


def _calibration(trace: Trace, figures: dict[str, Any], seconds: float,
                 repeats: int) -> Calibration:
    machine = {k: trace.manifest["machine"][k] for k in MACHINE_KEYS
               if k in trace.manifest["machine"]}
    from layercheck import __version__
    from layercheck.contract.measurement import MECHANISM_VERSIONS, code_record

    figures = {**figures, "stale_cost": _stale_cost(trace)}
    return Calibration(
        code=code_record(MECHANISM_VERSIONS, __version__),
        name=trace.name,
        description=(f"Measured by the profiler on the job of trace {trace.name} "
                     f"({trace.manifest['model'].get('label')}, {trace.num_steps} steps) on "
                     f"{machine.get('cpu', 'this machine')}: each strategy's mechanism timed "
                     f"{repeats} time(s), medians kept; {seconds:.0f} s of calibration, "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}."),
        figures=figures, model=dict(trace.manifest["model"]), machine=machine,
        full_bytes=trace.full_checkpoint_bytes)


def _stale_cost(trace: Trace) -> Figure:
    """The stale cost factor is not a mechanism's cost (``python -m profiler staleness``
    measures it, in minutes, not seconds): keep the one the trace's costs.json already
    holds, unless that is itself carried over (transferred, or filled in on reading),
    else carry the shipped capture's over by this trace's composition
    (``transferred_stale_cost``)."""
    kept = trace.costs.figures.get("stale_cost") if trace.costs is not None else None
    if kept is None or kept.source == "transferred":
        return transferred_stale_cost(trace)
    return kept


def transferred_stale_cost(trace: Trace) -> Figure:
    """The shipped capture's stale cost factor carried to ``trace`` by the share of its
    staleness that its embedding makes (``sim.composite.transfer_stale_cost``)."""
    layers = trace.layers
    share = embedding_share(trace.write_matrix(), layers["params"].to_numpy(dtype=np.float64),
                            (layers["kind"] == "embedding").to_numpy())
    return transfer_stale_cost(share, trace.name)


def job_spec(trace: Trace, where: str) -> CaptureConfig | ZeroConfig:
    """The capture settings of ``trace`` (a ZeroConfig for a ZeRO or an FSDP2 capture)."""
    sources = trace.manifest.get("sources", {})
    if trace.kind != "captured" or "capture" not in sources:
        raise ProfilerError(f"{where}: not a trace made by `python -m profiler capture` (no "
                            "capture settings to rebuild its job from)")
    config = CaptureConfig.from_dict(sources["capture"])
    if "deepspeed" in sources:
        ds = sources["deepspeed"]
        return ZeroConfig(capture=config, deepspeed=f"zero{ds['stage']}", ranks=int(ds["ranks"]))
    if "fsdp" in sources:
        return ZeroConfig(capture=config, fsdp=True, ranks=int(sources["fsdp"]["ranks"]))
    return config


def calibrate_trace(path: Path, *, repeats: int | None = None, scratch: Path | None = None,
                    say: Callable[[str], None] = print) -> Path | None:
    """Rebuild the job of the trace at ``path`` and write its ``costs.json``
    there; under ZeRO a collective of as many ranks as the capture had
    (rank 0 returns the path, the others None). ``scratch``: where to write
    the measured checkpoints (default: the temporary folder, where a capture
    puts its checkpoints)."""
    from .jobs import open_job
    trace = read_trace(path)
    job = open_job(job_spec(trace, str(path)), say=lambda _: None)
    job.step(0)  # the optimizer state a checkpoint holds exists after one step
    near = Path(scratch) if scratch else Path(tempfile.gettempdir())
    costs = calibrate_job(job, trace, near=near, say=say, repeats=repeats)
    if costs is None:
        return None
    return write_calibration(costs, Path(path))
