"""``python -m profiler validate``: the simulator's predictions against real runs killed at known times.

For a calibrated plain capture (``costs.json`` beside its trace), with one
failure log (drawn from ``mtbf_s`` with ``seed``, or given):

1. per strategy (deepspeed, checkfreq, layercheck: ``profiler.checkpointers``)
   a real run of the trace's job on this machine for ``window_s`` seconds,
   its workers SIGKILLed at the failure times and restarted
   (``profiler.supervisor``), accounted as the simulator does
   (``profiler.ledger``): the measured effective ratio
   (useful - stale) / window and its parts;
2. the simulator on the same trace, costs, failure log, window and interval
   (``sim.simulate`` with ``FailureModel.exact_log``): the predicted ratio;
3. a table: strategy, measured, predicted, relative error
   ((predicted - measured) / measured), failures, window; written as JSON
   (``validation.json`` in the trace folder unless ``out`` is given).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from layercheck.trace import Trace, read_trace

from .config import CaptureConfig, ValidationConfig
from .errors import ProfilerError

__all__ = ["validate", "ValidationResult", "failure_times", "VALIDATION_FILE"]

VALIDATION_FILE = "validation.json"
PARTS = ("useful_s", "stale_s", "checkpoint_stall_s", "lost_work_s", "recovery_s")


@dataclass(frozen=True)
class ValidationResult:
    path: Path
    doc: dict[str, Any]

    @property
    def table(self) -> list[dict[str, Any]]:
        return self.doc["table"]


def validate(trace_dir: Path, config: ValidationConfig, *, out: Path | None = None,
             scratch: Path | None = None, say: Callable[[str], None] = print,
             argv: list[str] | None = None) -> ValidationResult:
    """Run the validation of the module doc on the trace at ``trace_dir``."""
    from layercheck.calibration import CalibrationError, read_calibration
    trace = _plain_capture(trace_dir)
    try:
        calibration = read_calibration(trace_dir)
    except CalibrationError as exc:
        raise ProfilerError(f"{exc}") from None
    job = CaptureConfig.from_dict(trace.manifest["sources"]["capture"])
    times = config.failures_s if config.failures_s is not None else failure_times(
        mtbf_s=config.mtbf_s, window_s=config.window_s, seed=config.seed)
    interval = config.interval or max(1, round(trace.mean_weighted_staleness()))
    load = {"start": os.getloadavg()}
    measured = {}
    root = Path(tempfile.mkdtemp(prefix="layercheck-validate-", dir=scratch))
    try:
        for strategy in config.strategies:
            say(f"validate: {strategy}, {config.window_s:g} s, failures at "
                f"{', '.join(f'{t:g}' for t in times) or 'none'} s")
            measured[strategy] = _measure(strategy, trace, job, interval, times, config, root, say)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load["end"] = os.getloadavg()
    predicted = _predict(trace, calibration, times, interval, config)
    paced = {s: _predict(_at_pace(trace, _pace(trace, measured[s])), calibration, times, interval,
                         config, strategies=[s])[s] for s in config.strategies}
    doc = _document(trace, calibration, config, times, interval, measured, predicted, paced,
                    load, argv)
    path = Path(out) if out else Path(trace_dir) / VALIDATION_FILE
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return ValidationResult(path, doc)


def failure_times(*, mtbf_s: float, window_s: float, seed: int) -> tuple[float, ...]:
    """Exponential gaps of mean ``mtbf_s`` (seeded): the times that fall in the window."""
    import numpy as np
    rng = np.random.default_rng(seed)
    times, t = [], 0.0
    while True:
        t += float(rng.exponential(mtbf_s))
        if t >= window_s:
            return tuple(times)
        times.append(round(t, 3))


def _plain_capture(trace_dir: Path) -> Trace:
    trace = read_trace(trace_dir)
    sources = trace.manifest.get("sources", {})
    if trace.kind != "captured" or "capture" not in sources:
        raise ProfilerError(f"{trace_dir}: a validation re-runs a captured job; this trace has "
                            "no capture settings (make one with `python -m profiler capture`)")
    ranked = [k for k in ("deepspeed", "fsdp") if k in sources]
    if ranked:
        what = "a DeepSpeed" if ranked[0] == "deepspeed" else "an FSDP2"
        raise ProfilerError(f"{trace_dir}: {what} capture; the validation runs the job in "
                            "one process per worker, so give it a plain capture")
    return trace


def _measure(strategy: str, trace: Trace, job: CaptureConfig, interval: int,
             times: tuple[float, ...], config: ValidationConfig, root: Path,
             say: Callable[[str], None]) -> dict[str, Any]:
    from .ledger import account
    from .machine import resolve_device
    from .supervisor import RunSpec, supervise
    device, _ = resolve_device(job.device)
    spec = RunSpec(strategy=strategy, config=job, device=device, interval=interval,
                   failures_s=times, window_s=config.window_s, root=root / strategy)
    workers = supervise(spec, say=say)
    layers = trace.layers
    shares = dict(zip(layers["name"], layers["params"] / layers["params"].sum()))
    ledger = account(workers, window_s=config.window_s,
                     shares=shares if strategy == "layercheck" else None)
    shutil.rmtree(spec.root / "ckpt", ignore_errors=True)
    return ledger.to_dict()


def _pace(trace: Trace, ledger: dict[str, Any]) -> float:
    """The run's step time over the capture's (medians of compute)."""
    import numpy as np
    base = float(np.median(trace.compute_seconds()))
    return ledger["compute_median_s"] / base if ledger["compute_median_s"] > 0 else 1.0


def _at_pace(trace: Trace, factor: float) -> Trace:
    """The trace with every step's compute scaled by ``factor``: a diagnostic that
    separates the model's error from a machine that ran faster or slower than
    during the capture (another job's load)."""
    import dataclasses
    steps = trace.steps.copy()
    for column in ("forward_s", "backward_s", "optimizer_s"):
        steps[column] = steps[column] * factor
    return dataclasses.replace(trace, steps=steps)


def _predict(trace: Trace, calibration: Any, times: tuple[float, ...], interval: int,
             config: ValidationConfig, strategies: list[str] | None = None
             ) -> dict[str, dict[str, Any]]:
    from sim import CostModel, FailureModel, Scenario, simulate
    if not times:
        failures = FailureModel.exact_log([config.window_s * 2])  # none inside the window
    else:
        failures = FailureModel.exact_log(times)
    # stale_cost=1: the ledger counts every update stale layers discarded as lost
    # (profiler/ledger.py), whatever the calibration's stale cost factor
    scenario = Scenario.from_trace(trace, costs=CostModel.from_calibration(calibration),
                                   failures=failures, interval=interval, stale_cost=1.0)
    frame = simulate(scenario, mtbf_s=None, seeds=1, window_s=config.window_s,
                     strategies=strategies or list(config.strategies))
    return {row["strategy"]: {k: _plain(v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")}


def _document(trace: Trace, calibration: Any, config: ValidationConfig, times: tuple[float, ...],
              interval: int, measured: dict[str, Any], predicted: dict[str, Any],
              paced: dict[str, Any], load: dict[str, Any], argv: list[str] | None
              ) -> dict[str, Any]:
    table = []
    for strategy in config.strategies:
        m, p, q = measured[strategy], predicted[strategy], paced[strategy]
        table.append({"strategy": strategy, "measured_ratio": m["effective_ratio"],
                      "predicted_ratio": p["effective_ratio"],
                      "relative_error": _error(p, m),
                      "failures": m["failures"], "window_s": config.window_s,
                      "pace": _pace(trace, m), "predicted_at_pace": q["effective_ratio"],
                      "relative_error_at_pace": _error(q, m),
                      **{f"measured_{k}": m[k] for k in PARTS},
                      **{f"predicted_{k}": p.get(k) for k in PARTS}})
    return {"trace": trace.name, "window_s": config.window_s, "failures_s": list(times),
            "mtbf_s": None if config.failures_s is not None else config.mtbf_s,
            "seed": None if config.failures_s is not None else config.seed,
            "interval": interval, "costs": calibration.name,
            "command": "python -m profiler " + " ".join(argv) if argv else None,
            "load_average": load, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "table": table, "measured": measured, "predicted": predicted,
            "predicted_at_pace": paced,
            "method": ("measured: real runs of the trace's job killed with SIGKILL at the "
                       "failure times and restarted, accounted as the simulator does "
                       "(profiler/ledger.py); predicted: sim.simulate on the trace with its "
                       "costs.json and the same failure log (FailureModel.exact_log), window "
                       "and interval; predicted_at_pace (a diagnostic): the same, with the "
                       "trace's step times scaled by pace, the run's median step compute over "
                       "the capture's, which separates the model's error from a machine that "
                       "ran at another speed than during the capture")}


def _error(predicted: dict[str, Any], measured: dict[str, Any]) -> float:
    m = measured["effective_ratio"]
    return (predicted["effective_ratio"] - m) / m if m > 0 else float("nan")


def format_table(doc: dict[str, Any]) -> str:
    lines = [f"{'strategy':12s} {'measured':>9s} {'predicted':>9s} {'rel.err':>8s} "
             f"{'failures':>8s} {'window':>7s}   {'pace':>5s} {'at pace':>8s} {'rel.err':>8s}"]
    for row in doc["table"]:
        lines.append(f"{row['strategy']:12s} {row['measured_ratio']:9.4f} "
                     f"{row['predicted_ratio']:9.4f} {row['relative_error']:+8.2%} "
                     f"{row['failures']:8d} {row['window_s']:6.0f}s   {row['pace']:5.2f} "
                     f"{row['predicted_at_pace']:8.4f} {row['relative_error_at_pace']:+8.2%}")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """numpy scalars to Python numbers (JSON)."""
    return value.item() if hasattr(value, "item") else value
