"""``python -m profiler staleness``: what a stale layer costs, measured on real training.

A composite recovery resumes at the failure step t with some layers as they
were at older steps. The run goes on; what it loses is convergence. This
study measures it:

1. **Reference**: the capture's job trained failure-free to the end, the
   held-out loss of every held-out sequence evaluated every ``eval_every``
   steps, with one real ``LayerCheck`` per threshold attached (each in its own
   directory on ``scratch``; they only read the training state). Their writes
   give each threshold's parameter-weighted staleness S(t)
   (``layercheck.contract.trace.weighted_staleness``) and so its failure steps
   (``profiler.staleness.failure_steps``: the stalest step of each window, the
   paper's choice), among the steps that leave the shortest horizon to run.
2. **Snapshots**: the same job trained again from its initial weights up to
   the last failure step, the same LayerChecks attached; after each failure
   step's checkpoint commits, its directory is copied aside (hard links: the
   files are immutable once committed). This run must reproduce the
   reference's losses and writes bit for bit (checked): it is what makes the
   recoveries below resume on exactly the reference's data order.
3. **Recoveries**: for each copy, a new job restores the composite with
   ``LayerCheck.restore()`` (the library's own plan, verification and apply)
   and trains on to the end with the reference's data order, evaluated on
   the same grid.
4. **Controls**, at the main threshold's stalest step (the first threshold
   of ``main_thresholds`` present): *exact*, the true state of that step
   restored the same way (a LayerCheck whose base checkpoint is that step):
   it must equal the reference bit for bit, so the pipeline itself costs
   nothing; *reorder*, the exact state trained on with another data order
   (``reorders`` of them): the run's own trajectory noise, the yardstick a
   recovery's Delta is read against (the noise floor: the control's |loss gap|
   read as steps behind). Chosen over a random perturbation of
   matched size because it needs no choice of which norms to match, and it
   is the variation users already accept from their data order.

Delta (``profiler.convergence``): steps behind the reference by held-out
loss at each horizon after t (the first evaluated step at or after t + h,
and the end), with a paired bootstrap interval over held-out sequences.
phi = Delta / S(t). The result is ``staleness.json``; the figure the
simulator uses (``stale_cost``) is phi at ``figure_horizon`` for the trace's
own threshold, its interval widened by the noise floor.
"""
from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from layercheck.contract.calibration import COSTS_FILE, Figure, read_calibration, write_calibration
from layercheck.contract.trace import STUDY_FILE

from .config import CaptureConfig
from .convergence import Reading, SequenceLosses, read_delta, steps_behind
from .errors import ProfilerError
from .staleness import failure_steps

__all__ = ["StaleCostConfig", "run_study", "run_staleness", "stale_cost_figure", "set_stale_cost",
           "PAPER_THRESHOLDS", "STUDY_FILE"]

PAPER_THRESHOLDS = (1e-2, 1e-3, 1e-4)
"""The paper's threshold sweep (LayerCheck, IEEE CLUSTER 2026)."""
SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class StaleCostConfig:
    """A staleness study (module doc)."""

    capture: CaptureConfig = field(default_factory=CaptureConfig)
    """The job: model, steps, batch, LR, seed; its threshold is the trace's own."""
    thresholds: tuple[float, ...] = PAPER_THRESHOLDS
    """Base thresholds of the recoveries (embeddings get 10x each)."""
    failures: int = 1
    """Failure steps per threshold: the stalest step of each of this many windows."""
    eval_every: int = 10
    """Steps between held-out evaluations (step 0 and the last step always). Every
    evaluation reads every held-out sequence (155 for MiniLM, about six training steps'
    compute), so a shorter period costs most of the study's time."""
    eval_sequences: int | None = None
    """Held-out sequences per evaluation; None: all the corpus holds out."""
    horizons: tuple[int, ...] = (10, 50, 200)
    """Steps after the recovery at which Delta is read (the end of the job too)."""
    reorders: int = 1
    """Trajectory-noise controls: the exact state trained on with another data order."""
    resamples: int = 1000
    """Bootstrap resamples of the held-out sequences per reading."""
    figure_horizon: str = "end"
    """The horizon of the ``stale_cost`` figure: ``end`` or one of ``horizons``."""
    scratch: Path | None = None
    """Where the LayerCheck directories go; None: /dev/shm where it exists (the study
    writes every threshold's checkpoints; memory is fastest), else the temp folder."""

    def __post_init__(self) -> None:
        if not self.thresholds or any(not (isinstance(k, (int, float)) and k > 0 and math.isfinite(k))
                                      for k in self.thresholds):
            raise ProfilerError(f"thresholds {self.thresholds!r}: give positive numbers, e.g. "
                                "1e-2,1e-3,1e-4")
        for name in ("failures", "eval_every", "resamples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfilerError(f"{name}={value!r}: use a whole number >= 1")
        if isinstance(self.reorders, bool) or not isinstance(self.reorders, int) or self.reorders < 0:
            raise ProfilerError(f"reorders={self.reorders!r}: use a whole number >= 0")
        if self.eval_sequences is not None and (isinstance(self.eval_sequences, bool) or not isinstance(
                self.eval_sequences, int) or self.eval_sequences < 2):
            raise ProfilerError(f"eval_sequences={self.eval_sequences!r}: use at least 2 "
                                "(the interval resamples them)")
        if not self.horizons or any(isinstance(h, bool) or not isinstance(h, int) or h < 1
                                    for h in self.horizons):
            raise ProfilerError(f"horizons {self.horizons!r}: give whole numbers of steps >= 1")
        if self.figure_horizon != "end" and self.figure_horizon not in {str(h) for h in self.horizons}:
            raise ProfilerError(f"figure_horizon {self.figure_horizon!r}: use 'end' or one of "
                                f"the horizons {list(self.horizons)}")
        if self.capture.steps < self.eval_every + min(self.horizons) + 2:
            raise ProfilerError(f"a {self.capture.steps}-step job is too short for a study with "
                                f"eval_every {self.eval_every} and horizon {min(self.horizons)}: "
                                "give more --steps")
        object.__setattr__(self, "thresholds", tuple(float(k) for k in self.thresholds))

    @property
    def main_threshold(self) -> float:
        """The trace's own threshold when it is studied, else the middle one."""
        own = self.capture.resolved_threshold
        return own if own in self.thresholds else sorted(self.thresholds)[len(self.thresholds) // 2]

    def grid(self) -> list[int]:
        """The evaluated steps: 0, every ``eval_every``, and the last."""
        steps = self.capture.steps
        return sorted({0, steps, *range(self.eval_every, steps, self.eval_every)})

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["capture"] = self.capture.to_dict()
        out["scratch"] = None  # where it ran is not part of the result
        return out


def run_study(config: StaleCostConfig, *, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the study (module doc) and return the ``staleness.json`` document."""
    from .studyruns import Runs
    start = time.perf_counter()
    scratch = config.scratch or (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    with tempfile.TemporaryDirectory(prefix="layercheck-staleness-", dir=scratch) as tmp:
        runs = Runs(config, Path(tmp), say)
        reference = runs.reference()
        plan = _failure_plan(config, reference.staleness)
        say(f"staleness: failure steps {plan}")
        snaps = runs.snapshots(plan, reference)
        recoveries = [runs.recover(snap) for snap in snaps]
    doc = _document(config, reference, plan, recoveries)
    doc["seconds"] = time.perf_counter() - start
    return doc


def _failure_plan(config: StaleCostConfig, staleness: dict[float, np.ndarray]) -> dict[float, list[int]]:
    """Per threshold, the steps to fail at: the stalest of each window, among the
    steps that leave the shortest horizon (and one evaluation) to run."""
    last = config.capture.steps - min(config.horizons)
    plan = {}
    for k, series in staleness.items():
        allowed = series.copy()
        allowed[last:] = np.nan  # 1-based step t is series[t-1]; keep t <= last
        allowed = np.append(allowed, np.nan)  # failure_steps never picks the last entry
        try:
            plan[k] = failure_steps(allowed, config.failures)
        except ValueError as exc:
            raise ProfilerError(f"threshold {k:g}: {exc}; give more --steps or fewer --failures") from None
    return plan


# -- the document ---------------------------------------------------------------
def _document(config: StaleCostConfig, reference: Any, plan: dict[float, list[int]],
              runs: list[Any]) -> dict[str, Any]:
    ref = reference.losses
    doc = {"schema": SCHEMA, "kind": "staleness-study", "config": config.to_dict(),
           "model": reference.model, "machine": reference.machine,
           "reference": {"curve_steps": ref.steps.tolist(), "curve": ref.curve().tolist(),
                         "train_loss": reference.train_loss,
                         "staleness": {f"{k:g}": _nan_to_none(v) for k, v in
                                       reference.staleness.items()},
                         "writes": reference.writes, "sequence_losses": ref.to_dict()},
           "failure_steps": {f"{k:g}": v for k, v in plan.items()},
           "method": __doc__.split("\n\n", 1)[1].strip()}
    return {**doc, **_readings(config, ref, runs)}


def _readings(config: StaleCostConfig, ref: SequenceLosses, runs: list[Any]) -> dict[str, Any]:
    """The runs with their Delta and phi per horizon, the noise floor and the summary."""
    end = int(ref.steps[-1])
    rows = []
    for run in runs:
        readings = {name: read_delta(ref, run.losses, step, resamples=config.resamples,
                                     seed=run.failure_step)
                    for name, step in _horizon_steps(config, ref, run.failure_step, end).items()}
        rows.append({"kind": run.kind, "threshold": run.threshold, "failure_step": run.failure_step,
                     "staleness": run.staleness, "max_layer_staleness": run.max_layer_staleness,
                     "restored_sources": run.sources, "identical_to_reference": run.identical,
                     "readings": {n: r.to_dict() for n, r in readings.items()},
                     "phi": {n: _phi(r, run.staleness) for n, r in readings.items()},
                     "curve": run.losses.curve().tolist(), "curve_steps": run.losses.steps.tolist(),
                     "sequence_losses": run.losses.to_dict()})
    noise = _noise_floor(ref, rows)
    return {"runs": rows, "noise_floor": noise, "summary": _summary(config, rows, noise)}


def reread(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every reading, the noise floor and the summary read again from its
    stored per-sequence losses (after a change to how Delta is read; no training)."""
    config = doc["config"]
    study = StaleCostConfig(**{**config, "capture": CaptureConfig.from_dict(config["capture"]),
                               "thresholds": tuple(config["thresholds"]),
                               "horizons": tuple(config["horizons"]), "scratch": None})
    ref = SequenceLosses.from_dict(doc["reference"]["sequence_losses"])
    runs = [SimpleNamespace(kind=r["kind"], threshold=r["threshold"],
                            failure_step=r["failure_step"], staleness=r["staleness"],
                            max_layer_staleness=r["max_layer_staleness"],
                            sources=r["restored_sources"], identical=r["identical_to_reference"],
                            losses=SequenceLosses.from_dict(r["sequence_losses"]))
            for r in doc["runs"]]
    return {**doc, **_readings(study, ref, runs)}


def _horizon_steps(config: StaleCostConfig, ref: SequenceLosses, t: int, end: int) -> dict[str, int]:
    """Horizon name -> the first evaluated step at or after t + h (h past the end: none)."""
    out = {}
    for h in config.horizons:
        later = ref.steps[ref.steps >= t + h]
        if later.size and t + h <= end:
            out[str(h)] = int(later[0])
    out["end"] = end
    return out


def _phi(reading: Reading, staleness: float) -> dict[str, Any] | None:
    if not staleness > 0:
        return None
    return {"value": reading.delta / staleness, "low": reading.low / staleness,
            "high": reading.high / staleness, "censored": reading.censored}


def _noise_floor(ref: SequenceLosses, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per horizon, the steps behind that the largest |loss gap| of the reorder controls
    reads as: a recovery whose |Delta| lies within it is indistinguishable from the
    run's own trajectory noise. The gap is read in the behind direction whatever its
    sign, since a control ahead near the end of the job reads only as a bound."""
    controls = [r for r in rows if r["kind"] == "reorder"]
    names = sorted({n for r in controls for n in r["readings"]}, key=_horizon_key)
    curve = ref.curve()
    return {n: max(steps_behind(ref.steps, curve, r["readings"][n]["step"],
                                abs(r["readings"][n]["loss_gap"]))[0]
                   for r in controls if n in r["readings"]) for n in names}


def _summary(config: StaleCostConfig, rows: list[dict[str, Any]], noise: dict[str, Any]) -> dict[str, Any]:
    """phi per threshold and horizon (mean over failure steps; interval: the widest of
    their bootstrap bounds widened by the noise floor over S), and the figure."""
    out: dict[str, Any] = {}
    for k in config.thresholds:
        mine = [r for r in rows if r["kind"] == "composite" and r["threshold"] == k]
        per = {}
        for name in sorted({n for r in mine for n in r["readings"]}, key=_horizon_key):
            have = [r for r in mine if name in r["readings"] and r["phi"][name] is not None]
            if not have:
                continue
            floor = noise.get(name, 0.0)
            per[name] = {
                "delta": float(np.mean([r["readings"][name]["delta"] for r in have])),
                "value": float(np.mean([r["phi"][name]["value"] for r in have])),
                "low": float(min(r["phi"][name]["low"] - floor / r["staleness"] for r in have)),
                "high": float(max(r["phi"][name]["high"] + floor / r["staleness"] for r in have)),
                "staleness": float(np.mean([r["staleness"] for r in have])),
                "censored": sorted({r["phi"][name]["censored"] for r in have} - {None}),
                "failure_steps": [r["failure_step"] for r in have]}
        out[f"{k:g}"] = per
    main = out.get(f"{config.main_threshold:g}", {}).get(config.figure_horizon)
    return {"phi": out, "figure": None if main is None else {
        "threshold": config.main_threshold, "horizon": config.figure_horizon, **main}}


def _horizon_key(name: str) -> float:
    return math.inf if name == "end" else float(name)


def _nan_to_none(series: np.ndarray) -> list[float | None]:
    return [None if math.isnan(x) else float(x) for x in series]


# -- the command ------------------------------------------------------------------
def run_staleness(config: StaleCostConfig, *, from_trace: Path | None = None,
                  out: Path | None = None, say: Callable[[str], None] = print,
                  argv: list[str] | None = None) -> tuple[Path, dict[str, Any]]:
    """``python -m profiler staleness``: run the study on ``config``'s job (or on the
    job of the plain capture ``from_trace``), write ``staleness.json`` (``out``, or
    into the trace, or ``runs/staleness/``) and, into a trace that has a
    ``costs.json``, its ``stale_cost`` figure. Returns (path, document)."""
    from .failures.drill import plain_capture
    if from_trace is not None:
        trace, capture = plain_capture(Path(from_trace), "a staleness study")
        config = dataclasses.replace(config, capture=capture)
        dest = Path(out) if out else Path(from_trace) / STUDY_FILE
    else:
        trace = None
        dest = Path(out) if out else (Path("runs") / "staleness"
                                      / f"{config.capture.model}-{config.capture.steps}steps.json")
    if dest.exists() and dest.is_dir():
        raise ProfilerError(f"--out {dest} is a folder: give the JSON file to write")
    doc = run_study(config, say=say)
    doc["command"] = "python -m profiler " + " ".join(argv) if argv else None
    if trace is not None:
        doc["trace"] = trace.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc, default=float) + "\n")  # compact: every sequence's losses
    if trace is not None and (Path(from_trace) / COSTS_FILE).is_file():
        set_stale_cost(Path(from_trace) / COSTS_FILE, doc)
        say(f"staleness: stale_cost written into {Path(from_trace) / COSTS_FILE}")
    return dest, doc


def stale_cost_figure(doc: dict[str, Any]) -> Figure:
    """The ``stale_cost`` figure of a study document (its summary's figure)."""
    fig = doc["summary"]["figure"]
    if fig is None:
        raise ProfilerError("the study has no reading at its figure's horizon for its main "
                            "threshold; give a longer job or another --figure-horizon")
    cfg = doc["config"]
    floor = doc["noise_floor"].get(fig["horizon"], 0.0)
    name = doc.get("trace") or f"{cfg['capture']['model']}, {cfg['capture']['steps']} steps"
    censored = f"; censored readings: {', '.join(fig['censored'])}" if fig["censored"] else ""
    method = (f"python -m profiler staleness on {name} ({doc['model'].get('label')}): composite "
              f"recoveries with threshold {fig['threshold']:g} at steps {fig['failure_steps']} "
              f"(parameter-weighted staleness {fig['staleness']:.1f} steps) trained on with the "
              f"failure-free run's data order; Delta = {fig['delta']:.1f} steps behind by "
              f"held-out loss at horizon {fig['horizon']}; phi = Delta / staleness; interval: "
              f"the 95% paired bootstrap over held-out sequences, widened by the data-order "
              f"noise floor ({floor:.1f} steps){censored}")
    return Figure(value=fig["value"], low=fig["low"], high=fig["high"], source="measured",
                  method=method)


def set_stale_cost(costs: Path, doc: dict[str, Any]) -> None:
    """Put the study's figure into ``costs`` (a costs.json), keeping every other figure."""
    calibration = read_calibration(costs)
    figures = {**calibration.figures, "stale_cost": stale_cost_figure(doc)}
    write_calibration(dataclasses.replace(calibration, figures=figures), costs)


def numbers(text: str, kind: type, what: str) -> tuple:
    """A comma-separated list of ``kind`` (a command-line option's value)."""
    try:
        values = tuple(kind(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ProfilerError(f"{what} {text!r}: give comma-separated numbers, e.g. "
                            f"{'1e-2,1e-3' if kind is float else '10,50'}") from None
    if not values:
        raise ProfilerError(f"{what}: give at least one number")
    return values
