"""The probe beside a validation run: the machine's restart and checkpoint costs at the time of the run.

A figure timed at calibration describes the machine of that hour. On this
2-core machine the same restart took 8.85 s at a calibration, 13.7-14.9 s eight
hours later and 14.2-19.1 s the next morning, and DeepSpeed's saves ran 0.29 s
in the runs against the calibration's 0.46 s (docs/results.md). So just before each
strategy's run, ``probe`` times, on the machine as it is then:

- the restart, ``count`` times one after the other
  (``profiler.mechanisms.restart.time_restarts``: each worker SIGKILLed as the
  supervisor kills, its successor timed from the kill to ready). One start is one
  noisy sample, and the machine drifts during a run, so the run's restart is the
  median of these and of the restarts timed just after the run (``Beside.after``:
  the next run's probe, or ``restarts`` once a repeat's last run has ended), which
  estimate the run's own restarts better than the probe before it alone
  (docs/results.md, `python -m profiler.failures.estimates`);
- for a strategy whose run makes full saves on its training thread (deepspeed,
  and lowdiff's periodic full checkpoint), the probe's first worker trains under
  that strategy's own checkpointer at the run's cadence, inside a running job as
  the run meets its saves, for up to ``SAVES`` saves (three were too few: one
  probe's saves spread 0.15-0.38 s where its run's averaged 0.20 s): each full save's stall
  (its step's ``time - computed``, as the ledger counts it; for lowdiff less the
  median hand-off of its other steps), and for lowdiff each step's differential
  (its compression, ``tracking_s``, plus the hand-off to the writer), every step
  after the worker's first (whose excess the ledger counts as the restart's
  warm-up);
- for every strategy but gemini (whose peer the probe does not start), the first
  victim trains under the strategy's checkpointer at the run's cadence, and the
  first successor, under the same checkpointer in the victim's folder, loads its
  newest recovery point as a run's worker does after a failure: a fresh process's
  first load, from its ``ready`` to its ``resumed`` as the ledger counts it. The
  calibration times a load into the live job it saved from, which a fresh process
  loads several times slower (docs/results.md). Tiered's victim keeps its memory tier in a node folder of the probe's own
  (``_node_memory``), which the kill leaves: its successor's load is a restore from
  memory after a process's loss (``tier_restore_gbps``);
- for a strategy that names calibration mechanisms to probe (``RealStrategy.probed``:
  tiered's memory-tier copy and its thread's cost to a step, every step of its run),
  those mechanisms measured again, in this process on the job's model and optimizer
  state after one step, as ``python -m profiler calibrate`` measures them (``remeasure``).

``Beside.figures`` turns the medians into the cost model's figures
(``restart_s``, of the restarts before and after the run; ``save_gbps`` = the
trace's full bytes over the save; ``diff_snapshot_gbps`` = the differential's bytes
over its step cost; the load's figure, ``LOADS``, = the trace's full bytes over the
load less its fixed part, over a probed mechanism's figure of the same name; the probed
mechanisms' measured figures as they are), which
the validation's prediction uses in place of costs.json's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..checkpointers import REAL

__all__ = ["Beside", "probe", "restarts", "remeasure", "priced_load_s", "SAVES", "FULL_SAVES", "LOADS"]

SAVES = 6
"""Full saves the probe's first worker makes (fewer where the interval is long)."""
MAX_STEPS = 36
"""The most steps the probe's first worker trains for its saves."""
FULL_SAVES = tuple(name for name, r in REAL.items() if r.full_saves)
"""The strategies whose runs make full saves on the training thread at their interval
(``RealStrategy.full_saves``)."""
LOADS = {name: r.load for name, r in REAL.items() if r.load is not None}
"""Per strategy whose load the probe times (``RealStrategy.load``): the ``CostModel``
method that prices its recovery's load of the full bytes in the simulator
(``sim/strategies``; LowDiff's full checkpoint, killed just after one, replays no
differential), and the rate in it the probe replaces (the method's fixed part, its load
of no bytes, is kept)."""


def priced_load_s(strategy: str, costs: Any, full_bytes: float) -> float:
    """The load of ``strategy``'s full recovery point as ``costs`` price it (``LOADS``)."""
    return getattr(costs, LOADS[strategy][0])(full_bytes)


@dataclass(frozen=True, kw_only=True)
class Beside:
    """What the probe before one run timed (module doc)."""

    strategy: str
    restarts_s: tuple[float, ...]
    """The restarts timed just before the run."""
    after_s: tuple[float, ...] = ()
    """The restarts timed just after it (``after``); empty until the run has ended."""
    saves_s: tuple[float, ...] = ()
    """Each full save's stall (deepspeed, lowdiff); empty for the others."""
    diffs_s: tuple[float, ...] = ()
    """Each step's differential (lowdiff): compression plus hand-off."""
    load_s: float | None = None
    """The first successor's load of the first victim's newest recovery point (``LOADS``)."""
    load_step: int | None = None
    """The step it restored."""
    measured: dict[str, float] = dataclasses.field(default_factory=dict)
    """The probed mechanisms' figures (``remeasure``), by name."""

    def __post_init__(self) -> None:
        if not self.restarts_s:
            raise ValueError("a probe beside a run times at least one restart")

    @property
    def restart_s(self) -> float:
        """The run's restart: the median of the restarts before and after it."""
        return statistics.median(self.restarts_s + self.after_s)

    def after(self, restarts_s: tuple[float, ...]) -> "Beside":
        """This probe with the restarts timed once its run had ended (the next run's
        probe's ``restarts_s``, or ``restarts``), which bracket the run with these."""
        return dataclasses.replace(self, after_s=tuple(restarts_s))

    @property
    def save_s(self) -> float | None:
        return statistics.median(self.saves_s) if self.saves_s else None

    @property
    def diff_s(self) -> float | None:
        return statistics.median(self.diffs_s) if self.diffs_s else None

    def figures(self, workload: Any, costs: Any) -> dict[str, float]:
        """The cost figures that replace costs.json's in the run's prediction: the
        restart always, the full save, the load and the differential where they were timed
        (``workload``: the trace's ``sim`` workload, whose full bytes the simulator
        prices; ``costs``: the calibration's, for the differential's share of them)."""
        from sim.costs import GB
        out = {"restart_s": self.restart_s, **self.measured}
        if self.save_s is not None and self.save_s > 0:
            out["save_gbps"] = workload.full_bytes / (self.save_s * GB)
        if self.load_s is not None and self.strategy in LOADS:
            # the inverse of priced_load_s: the rate that prices the full bytes at load_s
            fixed = priced_load_s(self.strategy, costs, 0.0)
            if self.load_s > fixed:
                out[LOADS[self.strategy][1]] = workload.full_bytes / ((self.load_s - fixed) * GB)
        if self.diff_s is not None and self.diff_s > 0:
            # the inverse of CostModel.diff_snapshot_s
            out["diff_snapshot_gbps"] = costs.diff_bytes(workload.full_bytes) / (self.diff_s * GB)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "restart_s": self.restart_s,
                "restarts_s": list(self.restarts_s), "after_s": list(self.after_s),
                "save_s": self.save_s,
                "saves_s": list(self.saves_s), "diff_s": self.diff_s,
                "diffs_s": list(self.diffs_s), "load_s": self.load_s, "load_step": self.load_step,
                "measured": dict(self.measured)}

    @classmethod
    def from_steps(cls, strategy: str, restarts_s: tuple[float, ...], steps: tuple[dict, ...],
                   every: int, resumed: dict | None = None,
                   load_s: float | None = None) -> "Beside":
        """A probe's figures from its first worker's ``step`` events and its first
        successor's ``resumed`` event and ``load_s`` (a load only where it restored a
        step) (module doc)."""
        loaded = resumed is not None and load_s is not None and int(resumed["step"]) > 0
        load = {"load_s": float(load_s), "load_step": int(resumed["step"])} if loaded else {}
        if strategy not in FULL_SAVES:
            return cls(strategy=strategy, restarts_s=restarts_s, **load)
        first = min((int(e["step"]) for e in steps), default=0)
        later = [e for e in steps if int(e["step"]) > first]
        after = {int(e["step"]): float(e["time"]) - float(e["computed"]) for e in later}
        full = [s for s in after if s % every == 0]
        if not REAL[strategy].differentials:
            return cls(strategy=strategy, restarts_s=restarts_s,
                       saves_s=tuple(after[s] for s in full), **load)
        others = [e for e in later if int(e["step"]) % every]
        handoff = statistics.median(after[int(e["step"])] for e in others) if others else 0.0
        return cls(strategy=strategy, restarts_s=restarts_s,
                   saves_s=tuple(after[s] - handoff for s in full),
                   diffs_s=tuple(float(e["tracking_s"]) + after[int(e["step"])] for e in others),
                   **load)


def probe(job: Any, device: str, folder: Path, *, strategy: str, every: int, count: int,
          options: dict[str, Any] | None = None) -> Beside:
    """Probe the machine before ``strategy``'s run (module doc): the job of ``job`` (a
    ``CaptureConfig``) on ``device``, its checkpointer every ``every`` steps with
    ``options`` (the run's own), ``count`` restarts; in ``folder``, removed after."""
    beside = _probe_chain(job, device, folder, strategy=strategy, every=every, count=count,
                          options=options)
    if not REAL[strategy].probed:
        return beside
    return dataclasses.replace(beside, measured=remeasure(job, folder, REAL[strategy].probed))


def _probe_chain(job: Any, device: str, folder: Path, *, strategy: str, every: int, count: int,
                 options: dict[str, Any] | None) -> Beside:
    """The restarts, and the saves and the load where the strategy has them (``probe``)."""
    from ..mechanisms.restart import VICTIM_STEPS, time_restarts
    if strategy not in LOADS:
        return Beside(strategy=strategy, restarts_s=restarts(job, device, folder, count=count))
    if strategy in FULL_SAVES:
        kill_at = max(1, min(SAVES, MAX_STEPS // every)) * every
    else:
        # a few steps past the first recovery point (for CheckFreq's background
        # persist): LayerCheck's base, written at the end of its warm-up, or the
        # strategy's first checkpoint
        first = REAL[strategy].first_point(job, every)
        kill_at = VICTIM_STEPS + (first if first <= MAX_STEPS else 0)
    with _synced(folder), _node_memory(strategy, folder) as node:
        chain = time_restarts(job, device, folder, count=count, every=every, kill_at=kill_at,
                              strategy=strategy, options={**(options or {}), **node},
                              resume=True)
    return Beside.from_steps(strategy, chain.samples, chain.victim_steps, every,
                             chain.resumed, chain.load_s)


def restarts(job: Any, device: str, folder: Path, *, count: int) -> tuple[float, ...]:
    """``count`` restarts of the job of ``job`` on ``device`` one after the other, each
    victim checkpointing nothing (``time_restarts``' plain chain), in ``folder``, removed
    after: the probe of a strategy that times no load, and the restarts after a repeat's
    last run (``Beside.after``)."""
    from ..mechanisms.restart import VICTIM_STEPS, time_restarts
    with _synced(folder):
        return time_restarts(job, device, folder, count=count, kill_at=VICTIM_STEPS).samples


REMEASURE_REPEATS = 3
"""Repeats of each probed mechanism (the median is kept, as calibrate's default)."""


def remeasure(job: Any, folder: Path, names: tuple[str, ...]) -> dict[str, float]:
    """The figures the calibration mechanisms called ``names`` measure (all but those they
    only state), timed now on the job of ``job`` (a ``CaptureConfig``) after one step, in
    ``folder``, removed after; an unknown name is a ``ProfilerError`` naming the known."""
    from ..errors import ProfilerError
    from ..jobs.plain import PlainJob
    from ..mechanisms import MECHANISMS, Bench
    known = {m.name: m for m in MECHANISMS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ProfilerError(f"no calibration mechanism is called {unknown}: choose from "
                            f"{', '.join(known)}")
    with _synced(folder):
        plain = PlainJob.prepare(job, say=lambda _: None)
        plain.step(0)
        bench = Bench(job=plain, trace=None, folder=folder, repeats=REMEASURE_REPEATS,
                      say=lambda _: None)
        out = {}
        for name in names:
            mechanism = known[name]
            figures = mechanism.measure(bench)
            out.update({k: float(f.value) for k, f in figures.items() if k not in mechanism.stated})
        return out


@contextlib.contextmanager
def _node_memory(strategy: str, folder: Path) -> Iterator[dict[str, str]]:
    """A strategy with a memory tier on its node (``RealStrategy.node_memory``) gets its
    node's folder (``tier``, on tmpfs as in a run, removed after): its victim's memory
    tier outlives the kill, and the successor restores from it, as after a failure that
    lost only processes. Others get nothing."""
    if not REAL[strategy].node_memory:
        yield {}
        return
    from .nodes import NodeMemory
    node = NodeMemory(folder / "node")
    try:
        yield {"tier": str(node.folder)}
    finally:
        node.close()


@contextlib.contextmanager
def _synced(folder: Path) -> Iterator[None]:
    """A fresh ``folder`` for a chain of workers, removed after. Writes the page cache's
    dirty pages first (``os.sync``), so that the previous run's writes slow neither the
    probe nor the run."""
    folder.mkdir(parents=True)
    os.sync()
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)
