"""``python -m profiler validate``: the simulator's predictions against real runs killed at known times.

Contract. For a calibrated plain capture (``costs.json`` beside its trace), ``repeats``
times, each repeat with a failure log of its own (drawn from ``mtbf_s`` with seed
``seed + r``, redrawn while it has fewer than ``min_failures``; or the log given,
replayed by every repeat):

1. per strategy run for real (``profiler.checkpointers.REAL``), a run of the trace's
   job on this machine for ``window_s`` seconds at the cadence the simulator gives it
   on that log (``sim.api.cadences``), its workers SIGKILLed at the failure times and
   restarted, a peer process killed with them where the simulator's own draws say the
   failure took it (``sim.api.primary_loss_draws``; ``profiler.failures.supervisor``);
   measured: the effective ratio (useful - stale) / window and its parts, from the
   processes' own timestamped logs (``profiler.failures.ledger``). Just before each run
   a probe of the machine as it is then (``profiler.failures.costprobe``); after a
   repeat's last run, ``probes`` restarts more, so every run's restart is the median of
   restarts timed just before and just after it;
2. predicted: the simulator on the same trace, costs, failure log, window and cadence
   (``sim.simulate`` with ``FailureModel.exact_log``, seeded as the repeat), with the
   probe's figures in place of the calibration's (``Beside.figures``), since a figure
   timed hours before the runs describes another machine (docs/results.md);
   ``predicted_from_costs`` is the prediction with costs.json's own;
3. per repeat a row per strategy (measured, predicted, relative error
   (predicted - measured) / measured, failures, the parts), and per strategy the median
   relative error over the repeats with its smallest and largest; written as JSON
   (``validation.json`` in the trace folder unless ``out`` is given) and printed by
   ``format_table``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from layercheck.contract.trace import Trace, read_trace

from ..checkpointers import real
from ..config import (RANKED_CAPTURES, CaptureConfig, ValidationConfig,
                      default_interval, ranked_capture)
from ..contention import warning
from ..errors import ProfilerError

__all__ = ["validate", "ValidationResult", "failure_times", "failure_logs", "summarise",
           "format_table", "VALIDATION_FILE"]

VALIDATION_FILE = "validation.json"
PARTS = ("useful_s", "stale_s", "checkpoint_stall_s", "lost_work_s", "recovery_s")
REDRAWS = 1000
"""Draws a repeat may try before a log with ``min_failures`` is given up on."""


@dataclass(frozen=True)
class ValidationResult:
    path: Path
    doc: dict[str, Any]

    @property
    def table(self) -> list[dict[str, Any]]:
        return self.doc["table"]


@dataclass(frozen=True)
class FailureLog:
    """One repeat's failures: the seed that drew them (None: given), the draws it took."""

    repeat: int
    times: tuple[float, ...]
    seed: int | None = None
    redraws: int = 0


def validate(trace_dir: Path, config: ValidationConfig, *, out: Path | None = None,
             scratch: Path | None = None, say: Callable[[str], None] = print,
             argv: list[str] | None = None) -> ValidationResult:
    """Run the validation of the module doc on the trace at ``trace_dir``."""
    from layercheck.contract.calibration import CalibrationError
    from sim.calibrated import read_calibration
    trace = _plain_capture(trace_dir)
    # a capture that shared the machine gives the predicted side step times that are
    # not the job's: the comparison would measure the other job, so say it first
    said = warning(trace.manifest["machine"].get("contention"), f"the capture of {trace_dir}")
    if said:  # a warning, so shown even when progress is quiet
        print(f"warning: {said}; the predictions replay those step times", file=sys.stderr)
    try:
        calibration = read_calibration(trace_dir)
    except CalibrationError as exc:
        raise ProfilerError(f"{exc}") from None
    job = CaptureConfig.from_dict(trace.manifest["sources"]["capture"])
    interval = config.interval or default_interval(trace)
    logs = failure_logs(config)
    load = {"start": os.getloadavg()}
    runs = []
    root = Path(tempfile.mkdtemp(prefix="layercheck-validate-", dir=scratch))
    try:
        for log in logs:
            runs.append(_repeat(trace, calibration, job, interval, log, config, root, say))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load["end"] = os.getloadavg()
    doc = _document(trace, calibration, config, interval, runs, load, argv)
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


def failure_logs(config: ValidationConfig) -> list[FailureLog]:
    """Each repeat's failure log (``ValidationConfig.seed`` says how they are drawn)."""
    if config.failures_s is not None:
        return [FailureLog(r, tuple(config.failures_s)) for r in range(config.repeats)]
    logs = []
    for r in range(config.repeats):
        for attempt in range(REDRAWS):
            seed = config.seed + r + attempt * config.repeats
            times = failure_times(mtbf_s=config.mtbf_s, window_s=config.window_s, seed=seed)
            if len(times) >= config.min_failures:
                logs.append(FailureLog(r, times, seed, attempt))
                break
        else:
            raise ProfilerError(f"{REDRAWS} draws at an MTBF of {config.mtbf_s:g} s gave no "
                                f"{config.window_s:g} s log with {config.min_failures} failures: "
                                "lower --mtbf or raise --window")
    return logs


def _repeat(trace: Trace, calibration: Any, job: CaptureConfig, interval: int, log: FailureLog,
            config: ValidationConfig, root: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """One repeat: every strategy run for real on ``log``, and predicted."""
    from sim.api import primary_loss_draws
    from .nodes import losses
    scenario = _scenario(trace, calibration, log, interval)
    # a strategy whose checkpointer runs at one interval of its own (the memory tier's
    # every step) is run and predicted at it
    scenarios = {s: _scenario(trace, calibration, log, _interval(s, interval))
                 if real(s).every else scenario for s in config.strategies}
    plans = {s: scenarios[s].cadence(s, None) for s in config.strategies}
    draws = primary_loss_draws(scenario.seed, len(log.times))
    lost = tuple(bool(u < scenario.costs.peer_loss_probability) for u in draws)
    took = losses(draws, process_share=scenario.costs.tier_process_share,
                  buddy_loss_share=scenario.costs.tier_buddy_loss_share)
    measured, probes = {}, {}
    for strategy in config.strategies:
        say(f"validate: repeat {log.repeat + 1}/{config.repeats}, {strategy}, "
            f"{config.window_s:g} s, failures at {', '.join(f'{t:g}' for t in log.times)} s")
        folder = root / f"r{log.repeat}" / strategy
        probes[strategy] = probe = _probe(strategy, job, plans[strategy], scenario.costs,
                                          folder / "restart-probe", config.probes)
        say(f"validate: beside the run: {_said(probe, scenario)}")
        measured[strategy] = _measure(strategy, trace, job, plans[strategy], scenario.costs, log,
                                      lost, took, config, folder, say)
    probes = _bracketed(probes, _closing(job, root / f"r{log.repeat}" / "closing-probe",
                                         config.probes))
    say(f"validate: after the runs: {_said_after(probes)}")
    together = [s for s in config.strategies if scenarios[s] is scenario]
    from_costs = _predict(scenario, config.window_s, together) if together else {}
    from_costs.update({s: _predict(scenarios[s], config.window_s, [s])[s]
                       for s in config.strategies if s not in together})
    from_costs = {s: from_costs[s] for s in config.strategies}
    predicted = {s: _predict(_beside(scenarios[s], probes[s]), config.window_s, [s])[s]
                 for s in config.strategies}
    paced = {s: _predict(_beside(_scenario(_at_pace(trace, _pace(trace, measured[s])),
                                           calibration, log, _interval(s, interval)), probes[s]),
                         config.window_s, [s])[s]
             for s in config.strategies}
    table = [_row(trace, s, measured[s], predicted[s], paced[s], from_costs[s], probes[s],
                  config.window_s) for s in config.strategies]
    return {"repeat": log.repeat, "seed": log.seed, "redraws": log.redraws,
            "failures_s": list(log.times), "peer_lost": list(lost), "losses": list(took),
            "cadences": {s: _cadence_dict(c) for s, c in plans.items()},
            "probes": {s: p.to_dict() for s, p in probes.items()}, "table": table,
            "measured": measured,
            "predicted": predicted, "predicted_from_costs": from_costs,
            "predicted_at_pace": paced}


def _plain_capture(trace_dir: Path) -> Trace:
    trace = read_trace(trace_dir)
    sources = trace.manifest.get("sources", {})
    if trace.kind != "captured" or "capture" not in sources:
        raise ProfilerError(f"{trace_dir}: a validation re-runs a captured job; this trace has "
                            "no capture settings (make one with `python -m profiler capture`)")
    ranked = ranked_capture(sources)
    if ranked:
        raise ProfilerError(f"{trace_dir}: {RANKED_CAPTURES[ranked]} capture; the validation "
                            "runs the job in one process per worker, so give it a plain capture")
    return trace


def _measure(strategy: str, trace: Trace, job: CaptureConfig, cadence: Any, costs: Any,
             log: FailureLog, lost: tuple[bool, ...], took: tuple[str, ...],
             config: ValidationConfig, root: Path, say: Callable[[str], None]
             ) -> dict[str, Any]:
    from .ledger import account
    from ..machine import resolve_device
    from .supervisor import CONTENTION_FILE, RunSpec, supervise
    device, _ = resolve_device(job.device)
    spec = RunSpec(strategy=strategy, config=job, device=device,
                   interval=_every(cadence),
                   options=_options(strategy, cadence, costs),
                   failures_s=log.times, peer_lost=lost, losses=took,
                   window_s=config.window_s, root=root)
    workers = supervise(spec, say=say)
    layers = trace.layers
    shares = dict(zip(layers["name"], layers["params"] / layers["params"].sum()))
    ledger = account(workers, window_s=config.window_s,
                     shares=shares if real(strategy).layerwise else None)
    shutil.rmtree(spec.root / "ckpt", ignore_errors=True)
    contention = json.loads((spec.root / CONTENTION_FILE).read_text())
    said = warning(contention, f"the {strategy} run")  # None when quiet or unchecked
    if said:
        print(f"warning: {said}", file=sys.stderr)
    return {**ledger.to_dict(), "contention": contention}


def _interval(strategy: str, interval: int) -> int:
    """The interval ``strategy`` runs and is predicted at: its own where its checkpointer
    has one (``RealStrategy.every``), else the validation's."""
    return real(strategy).every or interval


def _every(cadence: Any) -> int:
    """The checkpointer's interval at ``cadence`` (None, LayerCheck's: every step)."""
    return cadence.every if cadence is not None else 1


def _options(strategy: str, cadence: Any, costs: Any) -> dict[str, Any]:
    """The strategy's checkpointer's own keywords at ``cadence`` (a run's, and its probe's)."""
    return real(strategy).options(cadence, costs)


def _said(probe: Any, scenario: Any) -> str:
    """The probe in one line, beside costs.json's figures."""
    costs, full = scenario.costs, scenario.workload.full_bytes
    text = (f"restarts of {_listed(probe.restarts_s)} s (costs.json: "
            f"{costs.restart_s:.2f} s)")
    if probe.save_s is not None:
        text += f", full saves of {probe.save_s:.3f} s (costs.json: {costs.save_s(full):.3f} s)"
    if probe.load_s is not None:
        from .costprobe import priced_load_s
        text += (f", a load of step {probe.load_step}'s recovery point in {probe.load_s:.3f} s "
                 f"(costs.json: {priced_load_s(probe.strategy, costs, full):.3f} s)")
    if probe.diff_s is not None:
        diff = costs.diff_snapshot_s(costs.diff_bytes(full))
        text += f", differentials of {probe.diff_s:.3f} s a step (costs.json: {diff:.3f} s)"
    return text


def _scenario(trace: Trace, calibration: Any, log: FailureLog, interval: int) -> Any:
    from sim import CostModel, FailureModel, Scenario
    # stale_cost=1: the ledger counts every update stale layers discarded as lost
    # (profiler/failures/ledger.py), whatever the calibration's stale cost factor; the seed is the
    # repeat's, so its draws of GEMINI's peer losses are the real run's too
    return Scenario.from_trace(trace, costs=CostModel.from_calibration(calibration),
                               failures=FailureModel.exact_log(log.times), interval=interval,
                               stale_cost=1.0, seed=log.seed or 0)


def _probe(strategy: str, job: CaptureConfig, cadence: Any, costs: Any, folder: Path,
           count: int) -> Any:
    """The machine just before ``strategy``'s run (module doc, 1.: ``costprobe.probe``)."""
    from ..machine import resolve_device
    from .costprobe import probe
    with _failing("before a run"):
        return probe(job, resolve_device(job.device)[0], folder, strategy=strategy,
                     every=_every(cadence), count=count,
                     options=_options(strategy, cadence, costs))


def _closing(job: CaptureConfig, folder: Path, count: int) -> tuple[float, ...]:
    """The restarts after a repeat's last run (``costprobe.restarts``)."""
    from ..machine import resolve_device
    from .costprobe import restarts
    with _failing("after the runs"):
        return restarts(job, resolve_device(job.device)[0], folder, count=count)


@contextlib.contextmanager
def _failing(when: str) -> Iterator[None]:
    """A probe's worker that failed is the validation's error, said in one line."""
    try:
        yield
    except RuntimeError as exc:
        raise ProfilerError(f"the restart probe {when} failed: {exc}") from None


def _bracketed(probes: dict[str, Any], closing: tuple[float, ...]) -> dict[str, Any]:
    """Each run's probe with the restarts timed after it (``Beside.after``): the next
    run's probe's, and ``closing`` after the last run."""
    names = list(probes)
    after = [probes[n].restarts_s for n in names[1:]] + [closing]
    return {n: probes[n].after(a) for n, a in zip(names, after)}


def _said_after(probes: dict[str, Any]) -> str:
    """Each run's restart, before and after it, in one line."""
    return "; ".join(f"{s} {p.restart_s:.2f} s (before {_listed(p.restarts_s)}, after "
                     f"{_listed(p.after_s)})" for s, p in probes.items())


def _listed(seconds: tuple[float, ...]) -> str:
    return ", ".join(f"{x:.2f}" for x in seconds)


def _beside(scenario: Any, probe: Any) -> Any:
    """``scenario`` with the probe's figures in place of costs.json's (``Beside.figures``)."""
    import dataclasses
    changes = probe.figures(scenario.workload, scenario.costs)
    return dataclasses.replace(scenario, costs=scenario.costs.with_overrides(**changes))


def _cadence_dict(cadence: Any) -> dict[str, Any] | None:
    if cadence is None:
        return None
    return {"every": cadence.every, "storage_every": cadence.storage_every,
            "batch": cadence.batch}


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


def _predict(scenario: Any, window_s: float, strategies: list[str]) -> dict[str, dict[str, Any]]:
    from sim import simulate
    frame = simulate(scenario, mtbf_s=None, seeds=1, window_s=window_s, strategies=strategies)
    return {row["strategy"]: {k: _plain(v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")}


def _row(trace: Trace, strategy: str, m: dict[str, Any], p: dict[str, Any], q: dict[str, Any],
         c: dict[str, Any], probe: Any, window_s: float) -> dict[str, Any]:
    return {"strategy": strategy, "measured_ratio": m["effective_ratio"],
            "predicted_ratio": p["effective_ratio"], "relative_error": _error(p, m),
            "failures": m["failures"], "window_s": window_s,
            "restart_probe_s": probe.restart_s, "save_probe_s": probe.save_s,
            "diff_probe_s": probe.diff_s, "load_probe_s": probe.load_s,
            "measured_restart_s": m["restart_s"],
            "predicted_from_costs": c["effective_ratio"],
            "relative_error_from_costs": _error(c, m),
            "pace": _pace(trace, m), "predicted_at_pace": q["effective_ratio"],
            "relative_error_at_pace": _error(q, m),
            **{f"measured_{k}": m[k] for k in PARTS},
            **{f"predicted_{k}": p.get(k) for k in PARTS}}


def summarise(runs: list[dict[str, Any]], strategies: tuple[str, ...] | list[str]
              ) -> list[dict[str, Any]]:
    """Per strategy over the repeats' rows: the median of every number, the relative
    error's smallest and largest, and the failures of each repeat."""
    out = []
    for strategy in strategies:
        rows = [row for run in runs for row in run["table"] if row["strategy"] == strategy]
        summary: dict[str, Any] = {"strategy": strategy, "repeats": len(rows)}
        for key, value in rows[0].items():
            if key in ("strategy", "failures") or not isinstance(value, (int, float)):
                continue
            summary[key] = statistics.median(row[key] for row in rows)
        errors = [row["relative_error"] for row in rows]
        summary["relative_error_min"], summary["relative_error_max"] = min(errors), max(errors)
        summary["failures"] = [row["failures"] for row in rows]
        out.append(summary)
    return out


def _document(trace: Trace, calibration: Any, config: ValidationConfig, interval: int,
              runs: list[dict[str, Any]], load: dict[str, Any], argv: list[str] | None
              ) -> dict[str, Any]:
    given = config.failures_s is not None
    return {"trace": trace.name, "window_s": config.window_s, "repeats": config.repeats,
            "min_failures": config.min_failures, "probes": config.probes,
            "failures_s": list(config.failures_s) if given else None,
            "mtbf_s": None if given else config.mtbf_s, "seed": None if given else config.seed,
            "interval": interval, "costs": calibration.name,
            "command": "python -m profiler " + " ".join(argv) if argv else None,
            "load_average": load,
            "capture_contention": trace.manifest["machine"].get("contention"),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "table": summarise(runs, config.strategies), "runs": runs,
            "method": ("measured: real runs of the trace's job killed with SIGKILL (with their "
                       "process groups) at the failure times and restarted, at the cadence the "
                       "simulator gives each strategy on that log (tiered: every step, its "
                       "memory tier's), GEMINI's peer process killed "
                       "too where the simulator's draws say the failure took it, and tiered's "
                       "node memory-tier folder wiped where they say the failure took the node "
                       "(its buddy's copy kept: runs[].losses, profiler/failures/nodes.py); "
                       "accounted from "
                       "the processes' own timestamped logs (profiler/failures/ledger.py); predicted: "
                       "sim.simulate on the trace with its costs.json and the same failure log "
                       "(FailureModel.exact_log), window, cadence and seed, and the restart probed "
                       "beside the run; table: per strategy "
                       "the median over the repeats (relative_error_min/max: the spread), runs: "
                       "every repeat's rows; restart_probe_s: the median of `probes` restarts "
                       "timed one after the other just before each run and of as many just "
                       "after it (the next run's probe's, or the repeat's closing restarts) "
                       "(each worker killed as the supervisor kills, its successor to ready; "
                       "runs[].probes: every sample, restarts_s before and after_s after), "
                       "the restart_s of that run's prediction; save_probe_s "
                       "(deepspeed, lowdiff): the median of the probe's first worker's full "
                       "saves at the run's interval, the save_gbps of its prediction (the "
                       "trace's full bytes over it); diff_probe_s (lowdiff): the median of "
                       "its differentials (compression and hand-off), the prediction's "
                       "diff_snapshot_gbps; load_probe_s (all but gemini): the probe's first "
                       "successor's load of its victim's newest recovery point, a fresh "
                       "process's as in the run, the load figure of its prediction "
                       "(profiler/failures/costprobe.py LOADS); "
                       "predicted_from_costs: the prediction with costs.json's figures, "
                       "timed at calibration; "
                       "predicted_at_pace (a diagnostic): the prediction, with "
                       "the trace's step times scaled by pace, the run's median step compute "
                       "over the capture's, which separates the model's error from a machine "
                       "that ran at another speed than during the capture")}


def _error(predicted: dict[str, Any], measured: dict[str, Any]) -> float:
    m = measured["effective_ratio"]
    return (predicted["effective_ratio"] - m) / m if m > 0 else float("nan")


def format_table(doc: dict[str, Any]) -> str:
    """Every repeat's rows, then the summary per strategy (median and spread)."""
    lines = []
    for run in doc["runs"]:
        seed = f"seed {run['seed']}, " if run["seed"] is not None else ""
        lines.append(f"repeat {run['repeat'] + 1}: {seed}failures at "
                     + ", ".join(f"{t:g}" for t in run["failures_s"]) + " s")
        lines.append(f"  {'strategy':11s} {'measured':>9s} {'predicted':>9s} {'rel.err':>8s} "
                     f"{'failures':>8s} {'restart':>7s} {'save':>6s} {'load':>6s}   {'costs.json':>10s} "
                     f"{'rel.err':>8s}"
                     f"   {'pace':>5s} {'at pace':>8s} {'rel.err':>8s}")
        for row in run["table"]:
            lines.append(f"  {row['strategy']:11s} {row['measured_ratio']:9.4f} "
                         f"{row['predicted_ratio']:9.4f} {row['relative_error']:+8.2%} "
                         f"{row['failures']:8d} {row['restart_probe_s']:6.2f}s "
                         f"{_seconds(row.get('save_probe_s'))} "
                         f"{_seconds(row.get('load_probe_s'))}   "
                         f"{row['predicted_from_costs']:10.4f} "
                         f"{row['relative_error_from_costs']:+8.2%}   {row['pace']:5.2f} "
                         f"{row['predicted_at_pace']:8.4f} {row['relative_error_at_pace']:+8.2%}")
    lines.append(f"median over {doc['repeats']} repeat(s), {doc['window_s']:g} s windows "
                 "(relative error: median [min, max])")
    lines.append(f"  {'strategy':11s} {'measured':>9s} {'predicted':>9s} {'rel.err':>8s} "
                 f"{'spread':>19s}  failures")
    for row in doc["table"]:
        lines.append(f"  {row['strategy']:11s} {row['measured_ratio']:9.4f} "
                     f"{row['predicted_ratio']:9.4f} {row['relative_error']:+8.2%} "
                     f"[{row['relative_error_min']:+7.2%}, {row['relative_error_max']:+7.2%}]  "
                     + ",".join(str(f) for f in row["failures"]))
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return f"{value:5.3f}s" if value is not None else f"{'-':>6s}"


def _plain(value: Any) -> Any:
    """numpy scalars to Python numbers (JSON)."""
    return value.item() if hasattr(value, "item") else value
