"""Where the wall-clock time of a real run under failures went, from its processes' event logs.

Pure (no torch), and independent of the simulator's code: the run's own
logs, read back from its folder (``read_run``): the supervisor's
(``supervisor.jsonl``: each worker's spawn, each kill, a peer lost with it)
and every worker's (``worker<i>.jsonl``: ready, resumed with the step it
restored, and per step the wall-clock ``begin``, ``computed`` (the
checkpoint begins) and ``time`` (it ends), ``profiler.failures.worker``). Every
duration below is a difference of those timestamps (less the strategy's own
seconds inside the step, which the worker reports: ``tracking_s``, LayerCheck's
drift inside the optimizer, and ``held_s``, CheckFreq's weight update waiting for
its snapshot).
The rules are the simulator's (``sim.engine``), applied to what really
happened:

- the window starts when the first worker resumes (its model is ready and
  training starts) and lasts ``window_s``; events after it do not count;
- ``useful_s``: the compute (``computed - begin``: forward + backward +
  optimizer, the strategy's tracking and held wait excluded) of every step never
  rolled back;
- a worker that resumes job j at step c rolls back every step of job j after
  c (their compute is lost work); a job's steps are final once the next job
  starts;
- ``stale_s`` (LayerCheck, tiered): at each recovery that resumes at c from a
  composite, per layer, its parameter share times the compute of the
  surviving steps after the step of the layer's copy up to c whose update to
  that layer was not already counted stale at an earlier recovery (LayerCheck's
  layer restored at c0 from version v is stale over (v, c0]; resumed again at c
  from v, only (c0, c] is new. Tiered's layer restored from memory at c0 is
  exact: a later composite's version v < c0 discards (v, c] whole);
- ``checkpoint_stall_s``: what the training thread spent on checkpoints
  (``time - computed`` plus tracking and the held wait: saves, waits,
  snapshots), whether or not its steps survived;
- ``recovery_s``: from each kill to the next worker's resume (``restart_s``
  to its ready, ``load_s`` from ready to resume), plus ``warmup_s``: the first
  step of a worker resumed past the job's start, beyond the median compute of
  the run's steps so far (a new process's first forward and backward are
  slower; the simulator charges the capture's own, ``sim.workload.warmup_from``);
- ``lost_work_s``: rolled-back compute plus the time the killed worker had
  spent since its last step (a step, or a save, in flight).

The measured effective ratio is ``(useful_s - stale_s) / window_s``.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Ledger", "WorkerLog", "account", "read_run", "SUPERVISOR_LOG"]

SUPERVISOR_LOG = "supervisor.jsonl"


@dataclass(frozen=True)
class WorkerLog:
    """One worker process: when it was started and killed (wall clock), and its events."""

    spawned: float
    killed: float | None
    events: Sequence[dict[str, Any]]


@dataclass
class Ledger:
    window_s: float
    useful_s: float = 0.0
    stale_s: float = 0.0
    checkpoint_stall_s: float = 0.0
    tracking_s: float = 0.0
    lost_work_s: float = 0.0
    recovery_s: float = 0.0
    restart_s: float = 0.0
    load_s: float = 0.0
    warmup_s: float = 0.0
    """Of ``recovery_s``: the first steps of resumed workers beyond the run's pace."""
    failures: int = 0
    jobs_done: int = 0
    steps_done: int = 0
    resumed_at: list[int] = field(default_factory=list)
    """The step each recovery resumed at (0: the job's start)."""
    recovered_from: list[str] = field(default_factory=list)
    """Tiered: per recovery, the tiers its layers came from (``memory``, ``storage``,
    ``memory+storage``; empty: nothing restored)."""
    compute_median_s: float = 0.0
    """The median compute of the steps done in the window (the run's own pace)."""

    @property
    def effective_ratio(self) -> float:
        return (self.useful_s - self.stale_s) / self.window_s

    @property
    def other_s(self) -> float:
        """What the parts above do not cover (job switches, logging, a step cut by the window)."""
        return self.window_s - (self.useful_s + self.checkpoint_stall_s + self.lost_work_s
                                + self.recovery_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "effective_ratio": self.effective_ratio, "other_s": self.other_s}


def account(workers: Sequence[WorkerLog], *, window_s: float,
            shares: dict[str, float] | None = None) -> Ledger:
    """The ledger of a run (see the module doc). ``workers`` in the order they ran;
    ``shares``: each layer's share of the parameters (LayerCheck's stale work)."""
    if not workers or not any(e["event"] == "resumed" for e in workers[0].events):
        raise ValueError("the first worker never started training: no time 0 to count from")
    start = next(e["time"] for e in workers[0].events if e["event"] == "resumed")
    end = start + window_s
    book = _Book(Ledger(window_s=window_s), shares or {})
    for i, worker in enumerate(workers):
        if i > 0:
            book.down_since(workers[i - 1].killed, worker, end)
        for k, event in enumerate(worker.events):
            if event["time"] > end:
                break
            book.take(event, recovery=i > 0 and k == _first_resume(worker))
        if worker.killed is not None and worker.killed <= end:
            book.killed(worker, worker.killed)
    return book.close()


def read_run(root: Path) -> list[WorkerLog]:
    """The logs of a run in folder ``root`` (``profiler.failures.supervisor``), workers in the order
    they ran: each one's spawn and kill from the supervisor's log, its events from its own."""
    spawned: dict[int, float] = {}
    killed: dict[int, float] = {}
    for event in _lines(Path(root) / SUPERVISOR_LOG):
        if event["event"] == "spawn":
            spawned[int(event["worker"])] = float(event["time"])
        elif event["event"] == "kill":
            killed[int(event["worker"])] = float(event["time"])
    return [WorkerLog(spawned[i], killed.get(i), _lines(Path(root) / f"worker{i}.jsonl"))
            for i in sorted(spawned)]


def _lines(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines log; a torn last line (the writer killed mid-line) is not an event."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _first_resume(worker: WorkerLog) -> int | None:
    return next((k for k, e in enumerate(worker.events) if e["event"] == "resumed"), None)


@dataclass
class _Book:
    ledger: Ledger
    shares: dict[str, float]
    job: int = 0
    timeline: dict[int, float] = field(default_factory=dict)
    """Surviving steps of the current job: step -> compute seconds."""
    counted: dict[str, set[int]] = field(default_factory=dict)
    """Per layer, the surviving steps of the current job whose update to it was counted
    stale."""
    computes: list[float] = field(default_factory=list)
    warming: bool = False
    """The next step is the first of a worker resumed past the job's start."""

    def take(self, event: dict[str, Any], *, recovery: bool) -> None:
        """``recovery``: the event is a new worker's resume after a failure."""
        kind, led = event["event"], self.ledger
        if kind == "resumed":
            self._resumed(event, recovery)
        elif kind == "step":
            # the strategy's seconds inside the step: tracking (LayerCheck's drift) and a
            # wait held before the weight update (CheckFreq's snapshot)
            tracking = float(event.get("tracking_s", 0.0))
            held = float(event.get("held_s", 0.0))
            compute = float(event["computed"]) - float(event["begin"]) - tracking - held
            if self.warming and self.computes:
                # a new process's first step: its time beyond the run's pace is the
                # restart's warm-up (sim: Workload.warmup_s), not work
                excess = max(0.0, compute - statistics.median(self.computes))
                compute -= excess
                led.warmup_s += excess
                led.recovery_s += excess
            self.warming = False
            self.timeline[int(event["step"])] = compute
            self.computes.append(compute)
            led.checkpoint_stall_s += (float(event["time"]) - float(event["computed"]) + tracking
                                       + held)
            led.tracking_s += tracking
            led.steps_done += 1
        elif kind == "job_done":
            self._final()
            led.jobs_done += 1

    def _resumed(self, event: dict[str, Any], recovery: bool) -> None:
        job, c = int(event["job"]), int(event["step"])
        if job != self.job:
            self._final()
            self.job = job
        gone = [s for s in self.timeline if s > c]
        self.ledger.lost_work_s += sum(self.timeline.pop(s) for s in gone)
        for steps in self.counted.values():  # a rolled-back step's number is used again
            steps.difference_update(gone)
        if recovery:
            self.ledger.resumed_at.append(c)
            if "tiers" in event:
                self.ledger.recovered_from.append("+".join(sorted(event["tiers"])))
        self.warming = recovery and c > 0
        if c > 0 and event.get("sources"):
            self.ledger.stale_s += self._stale(event["sources"], c)

    def _stale(self, sources: dict[str, int], c: int) -> float:
        total = 0.0
        for layer, src in sources.items():
            counted = self.counted.setdefault(layer, set())
            stale = [s for s in self.timeline if int(src) < s <= c and s not in counted]
            counted.update(stale)
            total += self.shares.get(layer, 0.0) * sum(self.timeline[s] for s in stale)
        return total

    def _final(self) -> None:
        self.ledger.useful_s += sum(self.timeline.values())
        self.timeline = {}
        self.counted = {}

    def killed(self, worker: WorkerLog, at: float) -> None:
        """The time since the killed worker's last event was in flight: lost."""
        self.ledger.failures += 1
        times = [e["time"] for e in worker.events if e["event"] in ("resumed", "step")
                 and e["time"] <= at]
        if any(e["event"] == "resumed" for e in worker.events if e["time"] <= at):
            self.ledger.lost_work_s += at - max(times)

    def down_since(self, killed: float | None, worker: WorkerLog, end: float) -> None:
        """Recovery: from the kill to this worker's resume (or the window's end)."""
        if killed is None or killed > end:
            return
        stop = min(end, worker.killed if worker.killed is not None else end)
        resumed = min(stop, next((e["time"] for e in worker.events if e["event"] == "resumed"),
                                 stop))
        ready = min(resumed, next((e["time"] for e in worker.events if e["event"] == "ready"),
                                  resumed))
        self.ledger.restart_s += ready - killed
        self.ledger.load_s += resumed - ready
        self.ledger.recovery_s += resumed - killed

    def close(self) -> Ledger:
        self._final()
        if self.computes:
            self.ledger.compute_median_s = float(statistics.median(self.computes))
        return self.ledger
