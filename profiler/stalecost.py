"""``python -m profiler staleness``: what a stale layer costs, measured on real training
and calibrated against real lost work.

A composite recovery resumes at the failure step f with some layers as they were
at older steps, and no replay. What it loses is convergence. The study:

1. **Reference**: the capture's job trained failure-free to the end, every held-out
   sequence evaluated every ``eval_every`` steps, one real ``LayerCheck`` per
   threshold attached (each in its own directory on ``scratch``; they only read the
   training state). Their writes give each threshold's parameter-weighted staleness
   S(t) and so its failure steps (``profiler.staleness.failure_steps``: the stalest
   step of each of ``failures`` windows, among the steps that leave the longest
   horizon to run).
2. **Snapshots**: the job trained again to the last failure step, the same
   LayerChecks attached, every step checked to repeat the reference bit for bit
   (what makes the recoveries see the reference's data); at each failure step its
   LayerCheck directory is copied aside (hard links) and the training states that
   the twins and controls resume from are held in memory.
3. **Replicates** (``profiler.replicates``): per threshold, failure step and data
   order (``draws`` of them: the reference's own, then others), the composite the
   library restores, the same composite with only its blocks or only its embedding
   stale (``parts``), and the **lost-work control** (every layer and its optimizer
   state S_c steps old, everything else of f, no replay: phi = 1 by the simulator's
   definition), each trained on with the same batches as the replicate's
   failure-free twin and evaluated at the horizons. With ``exact``, the true state
   of the first failure step restored through the library must repeat the
   reference bit for bit (the pipeline itself costs nothing).

Delta (``profiler.convergence``): how far behind the replicate's failure-free run a
run is by held-out loss at each horizon, in steps and in learning-rate-weighted
steps. phi is read under ``rule`` (``profiler.replicates``), its interval a
t-interval over the replicates with the evaluation's noise added. The result is
``staleness.json``; the figures the simulator uses are the composite's phi
(``stale_cost``) and its parts' (``stale_cost_blocks``, ``stale_cost_embedding``)
at ``figure_horizon`` for the main threshold.
"""
from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layercheck.contract.calibration import COSTS_FILE
from layercheck.contract.trace import STUDY_FILE, last_written

from .config import CaptureConfig
from .convergence import SequenceLosses, read_delta, resample_weights, steps_behind
from .errors import ProfilerError
from .replicates import PARTS, RULES, horizon_key, run_phi, summarize
from .staleness import failure_steps
from .stalefigure import set_stale_cost, stale_cost_figure

__all__ = ["StaleCostConfig", "run_study", "run_staleness", "stale_cost_figure", "set_stale_cost",
           "reread", "reread_file", "numbers", "PAPER_THRESHOLDS", "STUDY_FILE", "RULE"]

PAPER_THRESHOLDS = (1e-2, 1e-3, 1e-4)
"""The paper's threshold sweep (LayerCheck, IEEE CLUSTER 2026)."""
RULE = "relative"
"""How phi is read by default (``profiler.replicates``), fixed before the final runs by
the pilot docs/stale-cost.md describes (the tiny Qwen2, 200 steps, threshold 1e-2, 3
failure steps x 2 data orders, horizons 10, 50 and the end): the lost-work control read
1 within its interval at no horizon past the first in steps (1.25, 2.32, 7.13) and not
at the job's end in learning-rate-weighted steps (0.73 [0.58, 0.87]), while its Delta_c /
S_c, the relative rule's divisor, stayed above 0 within its interval at every horizon."""
SCHEMA = 2


@dataclass(frozen=True, kw_only=True)
class StaleCostConfig:
    """A staleness study (module doc)."""

    capture: CaptureConfig = dataclasses.field(default_factory=CaptureConfig)
    """The job: model, steps, batch, LR, seed; its threshold is the trace's own."""
    thresholds: tuple[float, ...] | None = None
    """Base thresholds of the recoveries (embeddings get 10x each); None: the trace's
    own (``PAPER_THRESHOLDS`` is the paper's sweep)."""
    failures: int = 2
    """Failure steps per threshold: the stalest step of each of this many windows."""
    draws: int = 2
    """Data orders per failure step: the reference's own, then draws - 1 others."""
    parts: bool = True
    """Also the composites whose stale part is only the blocks or only the embedding."""
    exact: bool = True
    """Also the exact-state control (the pipeline must cost nothing)."""
    eval_every: int = 10
    """Steps between held-out evaluations of the failure-free runs (step 0 and the last
    step always); the recoveries are evaluated at their horizons only."""
    eval_sequences: int | None = None
    """Held-out sequences per evaluation; None: all the corpus holds out."""
    horizons: tuple[int | str, ...] = (10, 50)
    """When after the failure phi is read: steps (read at the first evaluation at or
    after f + h), or ``end`` (the job's last step). A recovery trains to its last one."""
    rule: str = RULE
    """How phi is read: ``lr``, ``relative`` or ``steps`` (``profiler.replicates``)."""
    resamples: int = 1000
    """Bootstrap resamples of the held-out sequences (the evaluation's noise)."""
    figure_horizon: str | None = None
    """The horizon of the figures; None: the last of ``horizons``."""
    scratch: Path | None = None
    """Where the LayerCheck directories go; None: /dev/shm where it exists (the study
    writes every threshold's checkpoints; memory is fastest), else the temp folder."""

    def __post_init__(self) -> None:
        if self.thresholds is not None and (not self.thresholds or any(
                isinstance(k, bool) or not (isinstance(k, (int, float)) and k > 0 and math.isfinite(k))
                for k in self.thresholds)):
            raise ProfilerError(f"thresholds {self.thresholds!r}: give positive numbers, e.g. "
                                "1e-2,1e-3,1e-4")
        for name in ("failures", "draws", "eval_every", "resamples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfilerError(f"{name}={value!r}: use a whole number >= 1")
        if self.eval_sequences is not None and (isinstance(self.eval_sequences, bool) or not isinstance(
                self.eval_sequences, int) or self.eval_sequences < 2):
            raise ProfilerError(f"eval_sequences={self.eval_sequences!r}: use at least 2 "
                                "(the interval resamples them)")
        horizons = tuple(h if h == "end" else _whole(h) for h in self.horizons)
        if not horizons or len(set(horizons)) < len(horizons) or any(
                h is None or (h != "end" and h < 1) for h in horizons):
            raise ProfilerError(f"horizons {self.horizons!r}: give distinct whole numbers of "
                                "steps >= 1, or end")
        object.__setattr__(self, "horizons", tuple(sorted(horizons, key=lambda h: horizon_key(str(h)))))
        if self.rule not in RULES:
            raise ProfilerError(f"rule {self.rule!r}: use one of {', '.join(RULES)}")
        figure = self.figure_horizon or str(self.horizons[-1])
        if figure not in {str(h) for h in self.horizons}:
            raise ProfilerError(f"figure_horizon {self.figure_horizon!r}: use one of the "
                                f"horizons {[str(h) for h in self.horizons]}")
        object.__setattr__(self, "figure_horizon", figure)
        if self.capture.steps < self.eval_every + self.longest + 2:
            raise ProfilerError(f"a {self.capture.steps}-step job is too short for a study with "
                                f"eval_every {self.eval_every} and horizon {self.longest}: "
                                "give more --steps")
        if self.thresholds is not None:
            object.__setattr__(self, "thresholds", tuple(float(k) for k in self.thresholds))

    @property
    def studied(self) -> tuple[float, ...]:
        """The thresholds studied: ``thresholds``, else the job's own."""
        return self.thresholds or (self.capture.resolved_threshold,)

    @property
    def longest(self) -> int:
        """The longest horizon in steps (1 when only ``end``: a step to train on)."""
        return max([h for h in self.horizons if h != "end"], default=1)

    @property
    def main_threshold(self) -> float:
        """The trace's own threshold when it is studied, else the middle one."""
        own = self.capture.resolved_threshold
        return own if own in self.studied else sorted(self.studied)[len(self.studied) // 2]

    def grid(self) -> list[int]:
        """The evaluated steps: 0, every ``eval_every``, and the last."""
        steps = self.capture.steps
        return sorted({0, steps, *range(self.eval_every, steps, self.eval_every)})

    def horizon_steps(self, failure: int) -> dict[str, int]:
        """Horizon name -> the step its reading is at, for a failure at ``failure``."""
        grid = np.asarray(self.grid())
        end = self.capture.steps
        out = {}
        for h in self.horizons:
            later = grid[grid >= failure + h] if h != "end" else grid[-1:]
            if later.size and later[0] <= end:
                out[str(h)] = int(later[0])
        return out

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["capture"] = self.capture.to_dict()
        out["scratch"] = None  # where it ran is not part of the result
        out["studied"] = list(self.studied)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StaleCostConfig":
        fields = {k: v for k, v in data.items() if k != "studied"}
        return cls(**{**fields, "capture": CaptureConfig.from_dict(data["capture"]),
                      "thresholds": None if data["thresholds"] is None else tuple(data["thresholds"]),
                      "horizons": tuple(data["horizons"]), "scratch": None})


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
        specs = _replicates(config, reference, plan)
        exact_step = plan[config.main_threshold][0] if config.exact else None
        snaps = runs.snapshots(plan, {s.step - s.rollback for s in specs} | {s.step for s in specs},
                               exact_step)
        specs = _attach_snapshots(specs, snaps)
        recovered = []
        for i, spec in enumerate(specs, 1):
            say(f"staleness: run {i}/{len(specs)}")
            recovered.append(runs.recover(spec))
    doc = _document(config, reference, plan, recovered)
    doc["seconds"] = time.perf_counter() - start
    return doc


def _failure_plan(config: StaleCostConfig, staleness: dict[float, np.ndarray]) -> dict[float, list[int]]:
    """Per threshold, the steps to fail at: the stalest of each window, among the
    steps that leave the longest horizon (in steps) to run."""
    last = config.capture.steps - config.longest
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


def _replicates(config: StaleCostConfig, reference: Any, plan: dict[float, list[int]]) -> list[Any]:
    """The recoveries to run: per threshold, failure step and draw the composite, its
    parts and the control; per failure step and draw after the first its twin; the
    exact control at the main threshold's first failure step."""
    from .studyruns import Recovery, lr_clock
    clock = lr_clock(config.capture)
    specs, stops = [], {}
    for k, steps in plan.items():
        last = last_written(reference.written[k])
        for f in steps:
            at = config.horizon_steps(f)
            stop = max(at.values())
            stops[f] = max(stops.get(f, 0), stop)
            evals = tuple(sorted(set(at.values())))
            src = last[f - 1]
            share = reference.params / reference.params.sum()
            steps_age, lr_age = (f - src) * share, (clock[f] - clock[src]) * share
            emb = reference.embedding
            parts = {"composite": (np.ones_like(emb), ()),
                     "blocks": (~emb, _names(reference, emb)),
                     "embedding": (emb, _names(reference, ~emb))}
            rollback = max(1, int(round(float(steps_age.sum()))))
            for d in range(config.draws):
                common = dict(threshold=k, step=f, draw=d, stop=stop, evals=evals)
                for part in PARTS if config.parts else ("composite",):
                    mask, fresh = parts[part]
                    s = float(steps_age[mask].sum())
                    if part != "composite" and not s > 0:
                        continue  # nothing of it stale: the run would be the twin
                    specs.append(Recovery(kind=part, staleness=s,
                                          staleness_lr=float(lr_age[mask].sum()), fresh=fresh,
                                          **common))
                specs.append(Recovery(kind="control", staleness=float(rollback),
                                      staleness_lr=float(clock[f] - clock[f - rollback]),
                                      rollback=rollback, **common))
    grid = np.asarray(config.grid())
    for f, stop in sorted(stops.items()):
        for d in range(1, config.draws):
            evals = tuple(int(s) for s in grid[(grid > f) & (grid <= stop)])
            specs.append(Recovery(kind="twin", threshold=None, step=f, draw=d, stop=stop, evals=evals))
    if config.exact:
        f = plan[config.main_threshold][0]
        specs.append(Recovery(kind="exact", threshold=None, step=f, draw=0, stop=stops[f],
                              evals=tuple(sorted(set(config.horizon_steps(f).values())))))
    return specs


def _names(reference: Any, mask: np.ndarray) -> tuple[str, ...]:
    """The parameter names of the layers ``mask`` selects."""
    return tuple(name for layer, chosen in zip(reference.names, mask) if chosen for name in layer)


def _attach_snapshots(specs: list[Any], snaps: list[Any]) -> list[Any]:
    """Each composite-based recovery with the directory copy it restores."""
    by = {(s.kind, s.threshold, s.step): s for s in snaps}
    out = []
    for spec in specs:
        if spec.kind in PARTS:
            spec = dataclasses.replace(spec, snapshot=by[("composite", spec.threshold, spec.step)])
        elif spec.kind == "exact":
            spec = dataclasses.replace(spec, snapshot=by[("exact", None, spec.step)])
        out.append(spec)
    return out


# -- the document ---------------------------------------------------------------
def _document(config: StaleCostConfig, reference: Any, plan: dict[float, list[int]],
              recovered: list[Any]) -> dict[str, Any]:
    from .studyruns import lr_clock
    ref = reference.losses
    rows = [{"kind": r.spec.kind, "threshold": r.spec.threshold, "failure_step": r.spec.step,
             "draw": r.spec.draw, "stop": r.spec.stop, "staleness": r.spec.staleness,
             "staleness_lr": r.spec.staleness_lr, "rollback": r.spec.rollback,
             "max_layer_staleness": r.max_layer_staleness, "restored_sources": r.sources,
             "identical_to_reference": r.identical, "sequence_losses": r.losses.to_dict()}
            for r in recovered]
    doc = {"schema": SCHEMA, "kind": "staleness-study", "config": config.to_dict(),
           "model": reference.model, "machine": reference.machine,
           "reference": {"curve_steps": ref.steps.tolist(), "curve": ref.curve().tolist(),
                         "lr_clock": lr_clock(config.capture).tolist(),
                         "train_loss": reference.train_loss,
                         "staleness": {f"{k:g}": _nan_to_none(v) for k, v in
                                       reference.staleness.items()},
                         "layers": {"params": reference.params.tolist(),
                                    "embedding": reference.embedding.tolist()},
                         "writes": reference.writes, "sequence_losses": ref.to_dict()},
           "failure_steps": {f"{k:g}": v for k, v in plan.items()},
           "method": __doc__.split("\n\n", 1)[1].strip()}
    return {**doc, **_readings(config, doc["reference"], rows)}


def reread(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``doc`` with every reading, the noise floor and the summary read again from its
    stored per-sequence losses (``changes``: to the study's settings that reading uses,
    e.g. ``rule``); no training."""
    config = StaleCostConfig.from_dict({**doc["config"], **changes})
    rows = [{k: v for k, v in r.items() if k in _STORED} for r in doc["runs"]]
    return {**doc, "config": config.to_dict(), **_readings(config, doc["reference"], rows)}


_STORED = ("kind", "threshold", "failure_step", "draw", "stop", "staleness", "staleness_lr",
           "rollback", "max_layer_staleness", "restored_sources", "identical_to_reference",
           "sequence_losses")


def _readings(config: StaleCostConfig, reference: dict[str, Any], rows: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Every run's Delta per horizon on both clocks (its replicate's failure-free run the
    ruler), phi per run, the noise floor and the summary."""
    ref = SequenceLosses.from_dict(reference["sequence_losses"])
    clock = np.asarray(reference["lr_clock"])
    weights = resample_weights(len(ref.tokens), config.resamples, seed=config.capture.seed)
    twins = {(r["failure_step"], r["draw"]): SequenceLosses.from_dict(r["sequence_losses"])
             for r in rows if r["kind"] == "twin"}
    out = []
    for row in rows:
        losses = SequenceLosses.from_dict(row["sequence_losses"])
        f, stop = row["failure_step"], row["stop"]
        ruler = _upto(ref, stop)
        if row["draw"] and row["kind"] != "twin":
            ruler = ruler.joined(twins[(f, row["draw"])], f)
        at = {n: s for n, s in config.horizon_steps(f).items() if s <= stop}
        row = {**row, "curve_steps": losses.steps.tolist(), "curve": losses.curve().tolist(),
               "readings": {n: _reading(ruler, losses, s, weights, None) for n, s in at.items()},
               "readings_lr": {n: _reading(ruler, losses, s, weights, clock) for n, s in at.items()}}
        out.append(row)
    controls = {(r["threshold"], r["failure_step"], r["draw"]): r for r in out if r["kind"] == "control"}
    for row in out:
        row["phi"] = {}
        for name in row["readings"]:
            got = None if row["kind"] in ("twin", "exact") else run_phi(
                row, controls.get((row["threshold"], row["failure_step"], row["draw"])), name,
                config.rule)
            row["phi"][name] = None if got is None else {
                "value": float(got[0]), "low": float(np.quantile(got[1], 0.025)),
                "high": float(np.quantile(got[1], 0.975)), "rule": config.rule,
                "censored": row["readings"][name]["censored"]}
    summary = summarize([r for r in out if r["kind"] not in ("twin", "exact")], rule=config.rule,
                        main=config.main_threshold, figure_horizon=config.figure_horizon)
    noise = _noise_floor(ref, [r for r in out if r["kind"] == "twin"])
    for row in out:  # the resampled readings are read again, not stored
        for key in ("readings", "readings_lr"):
            row[key] = {n: {k: v for k, v in r.items() if k != "draws"} for n, r in row[key].items()}
    return {"runs": out, "noise_floor": noise, "summary": summary}


def _reading(ruler: SequenceLosses, run: SequenceLosses, step: int, weights: np.ndarray,
             clock: np.ndarray | None) -> dict[str, Any]:
    reading = read_delta(ruler, run, step, weights=weights, clock=clock)
    return {**reading.to_dict(), "draws": reading.draws}


def _upto(losses: SequenceLosses, stop: int) -> SequenceLosses:
    keep = losses.steps <= stop
    return SequenceLosses(losses.steps[keep], losses.loss[keep], losses.tokens)


def _noise_floor(ref: SequenceLosses, twins: list[dict[str, Any]]) -> dict[str, float]:
    """Per horizon, the steps behind that the largest |loss gap| of a twin on another data
    order reads as against the reference: how far apart two equally good runs drift
    (the gap is read in the behind direction whatever its sign)."""
    names = sorted({n for r in twins for n in r["readings"]}, key=horizon_key)
    curve = ref.curve()
    return {n: max(steps_behind(ref.steps, curve, r["readings"][n]["step"],
                                abs(r["readings"][n]["loss_gap"]))[0]
                   for r in twins if n in r["readings"]) for n in names}


def _nan_to_none(series: np.ndarray) -> list[float | None]:
    return [None if math.isnan(x) else float(x) for x in series]


# -- the command ------------------------------------------------------------------
def run_staleness(config: StaleCostConfig, *, from_trace: Path | None = None,
                  out: Path | None = None, say: Callable[[str], None] = print,
                  argv: list[str] | None = None) -> tuple[Path, dict[str, Any]]:
    """``python -m profiler staleness``: run the study on ``config``'s job (or on the
    job of the plain capture ``from_trace``, with ``config``'s thread count where it
    gives one: the study's runs need only agree with each other), write
    ``staleness.json`` (``out``, or into the trace, or ``runs/staleness/``) and, when it
    goes into a trace that has a ``costs.json``, its ``stale_cost`` figure there. Returns
    (path, document)."""
    from .failures.drill import plain_capture
    if from_trace is not None:
        trace, capture = plain_capture(Path(from_trace), "a staleness study")
        if config.capture.threads is not None:
            capture = capture.replace(threads=config.capture.threads)
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
    dest.write_text(json.dumps(doc, default=float, separators=(",", ":")) + "\n")
    if trace is not None and dest.parent.resolve() == Path(from_trace).resolve() and (
            Path(from_trace) / COSTS_FILE).is_file():  # --out elsewhere leaves the trace alone
        set_stale_cost(Path(from_trace) / COSTS_FILE, doc)
        say(f"staleness: stale-cost figures written into {Path(from_trace) / COSTS_FILE}")
    return dest, doc


def reread_file(path: Path, *, rule: str | None = None, argv: list[str] | None = None
                ) -> dict[str, Any]:
    """``python -m profiler staleness --reread FILE``: the study at ``path`` read again from
    its stored losses by this code (``reread``; ``rule``: another rule), written back, and
    its ``stale_cost`` put into the costs.json beside it (a trace's). No training."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfilerError(f"--reread {path}: not a readable study ({exc})") from None
    if doc.get("kind") != "staleness-study" or doc.get("schema") != SCHEMA:
        raise ProfilerError(f"--reread {path}: not a staleness study of schema {SCHEMA}; run "
                            "the study again")
    again = reread(doc, **({} if rule is None else {"rule": rule}))
    again["reread"] = "python -m profiler " + " ".join(argv) if argv else None
    path.write_text(json.dumps(again, default=float, separators=(",", ":")) + "\n")
    if (path.parent / COSTS_FILE).is_file():
        set_stale_cost(path.parent / COSTS_FILE, again)
    return again


def numbers(text: str, kind: type, what: str) -> tuple:
    """A comma-separated list of ``kind`` (a command-line option's value); ``end`` is
    kept as it is where ``kind`` is int (a horizon)."""
    try:
        values = tuple(part.strip() if kind is int and part.strip() == "end" else kind(part)
                       for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ProfilerError(f"{what} {text!r}: give comma-separated numbers, e.g. "
                            f"{'1e-2,1e-3' if kind is float else '10,50'}") from None
    if not values:
        raise ProfilerError(f"{what}: give at least one number")
    return values

