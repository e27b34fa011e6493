"""Checkpointing strategies as small classes behind one base.

A strategy turns a job (``Workload``), a cost model and a ``Cadence`` into a
``Schedule``: what checkpointing costs after each step and what a recovery
costs from each position. The engines (``engine`` fast, ``reference`` SimPy)
execute schedules; no strategy knows about failures.

Contract of ``Strategy.schedule`` (subclasses override the hooks, called in
this order):

1. ``_checkpoints(b)`` fills ``b.snap`` (training stalls this long after step
   i), ``b.persist`` (then the blocking background writer works this long; the
   step's snapshot first waits until the writer is idle), ``b.commit`` (step i
   becomes a recovery point once durable: at the end of its persist, or of its
   snapshot when nothing is persisted) and ``b.bytes``.
2. ``_backup(b)`` optionally fills ``b.backup``: a second, non-blocking tier
   (seconds after the snapshot until durable; NaN where none).
3. ``_recovery(b)`` returns the seconds a recovery takes when resuming at
   position j = 0..N from the primary tier (and ``_recovery_backup`` from the
   backup tier).
4. ``_footprint(b)`` says what the checkpoints occupy besides time: the host
   memory they hold, the durable storage one recovery point takes, and which
   of ``b.bytes`` reach durable storage (``Footprint``; the fair comparison's
   budgets and the bill in dollars read it).

``Strategy.cadence`` says how often a rollback strategy checkpoints under a
protocol: ``matched`` (the paper's matched freshness), ``native`` (as its
authors designed it: the ``_native`` hook) or a fixed interval.

No strategy has a recovery point before its first durable checkpoint:
position 0 (the job's start) is where a failure before it resumes, and
resuming there costs only the restart (``restart_s`` builds the model from
its initial weights; there is no checkpoint to load). Step N is the job's end: the training script's own final save
commits it, the same for every strategy, so no strategy is charged a
checkpoint there.

This module holds the base and the figure every strategy uses (``restart_s``)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from layercheck.contract.band import Band
from layercheck.contract.figure import Figure, FigureSpec

from ..composite import Composite
from ..errors import SimError
from ..theory import daly_interval_s

# ``Workload`` (sim.workload) and ``CostModel`` (sim.costs) appear in annotations only and
# are not imported: both read the calibration schema, which is the union of this
# package's declarations, so importing them here would be a cycle.

__all__ = ["Cadence", "Schedule", "Strategy", "Footprint", "PROTOCOLS", "FIGURES", "STRATEGIES",
           "LADDER", "ladder"]

FIGURES: dict[str, FigureSpec] = {
    "restart_s": FigureSpec("s", "all", "a new training process up to a model ready to load "
                                        "(process start, imports, model built from its initial "
                                        "weights), after a failure; all a resume at the job's "
                                        "start costs",
        band=Band(low=0.5, high=2.0, relative=True, reason=(
            "one process's restart measured 10.6 and 10.8 s here (minilm-1000steps, "
            "minilm-200steps), a 2-rank torchrun 19.1 s (minilm-zero3-200steps): ranks nearly "
            "double it; half to twice")),
        default=Figure(value=30.0, source="assumed", method=(
        "relaunching 8 ranks on one server up to a model built from its initial weights "
        "(process start, CUDA context, NCCL init); the paper's recovery times exclude it"), band=Band(low=10.8, high=120.0, reason=(
        "low: one CPU process's restart measured here (10.8 s, traces/minilm-200steps "
        "restart_s), which 8 GPU ranks cannot beat; high: 4x the assumption, a judgment (the "
        "paper's recovery times exclude the restart)")))),
}
"""The figures this module declares (``sim.calibrated.FIGURES`` is the union)."""


LADDER = (4, 3)
"""Points per doubling and doublings each way of an interval ladder: 4 per doubling (19%
apart, where the ratio's optimum is flat to a few parts in 10,000) over 1/8 to 8 times
the theory's interval."""


def ladder(start: float, steps: int, *, per_doubling: int = LADDER[0],
           doublings: int = LADDER[1]) -> list[int]:
    """Whole intervals ``start`` x 2^(k / per_doubling), k = -per_doubling x doublings ..
    +per_doubling x doublings, within 1 .. ``steps``, each once, ascending."""
    k = np.arange(-per_doubling * doublings, per_doubling * doublings + 1)
    points = np.round(max(start, 1.0) * 2.0 ** (k / per_doubling)).astype(np.int64)
    return sorted({int(p) for p in np.clip(points, 1, steps)})


PROTOCOLS = ("matched", "native")
"""matched: rollback strategies checkpoint every ``round(staleness)`` steps, LayerCheck's
mean parameter-weighted staleness on the same trace (the paper's comparison); native:
each strategy as its authors designed it (``Strategy._native``)."""



@dataclass(frozen=True, kw_only=True)
class Cadence:
    """How often a rollback strategy checkpoints, in steps."""

    every: int
    """The primary tier (deepspeed, checkfreq: full checkpoints; gemini: in-memory
    copies; lowdiff: full checkpoints between its per-step differentials)."""
    storage_every: int | None = None
    """gemini's storage tier (its last resort)."""
    batch: int | None = None
    """lowdiff's differentials per write (None: the cost model's ``diff_batch``)."""

    def __post_init__(self) -> None:
        for value in (self.every, self.storage_every, self.batch):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                      or value < 1):
                raise SimError(f"a checkpoint interval of {value!r} steps: use a whole number >= 1")


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """What a strategy's checkpoints occupy besides time, on one failure-free job."""

    durable_bytes: float = 0.0
    """Bytes written to durable storage over the job (GEMINI: its storage tier, not its
    copies to a peer's memory)."""
    moved_bytes: float = 0.0
    """Every byte its checkpoints copy over the job, to storage or to a peer (``bytes``)."""
    host_bytes: float = 0.0
    """The most host memory its checkpoints hold at once (snapshot buffers, copies kept
    in memory, a writer's queue)."""
    point_bytes: float = 0.0
    """Durable storage one recovery point occupies (a full checkpoint; LowDiff's with the
    differentials after it; one version of every layer)."""
    base_bytes: float = 0.0
    """Durable storage kept beside the recovery points whatever their number (LayerCheck's
    base checkpoint, which its retention keeps)."""

    def stored_bytes(self, keep: int) -> float:
        """Durable storage held when the ``keep`` newest recovery points are kept."""
        return keep * self.point_bytes + self.base_bytes

    @property
    def durable_share(self) -> float:
        """The share of the bytes its checkpoints move that reach durable storage."""
        return self.durable_bytes / self.moved_bytes if self.moved_bytes > 0 else 1.0


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A strategy's costs on one job; arrays have N+1 entries, index i = after step i."""

    strategy: str
    compute: np.ndarray
    snap: np.ndarray
    persist: np.ndarray
    commit: np.ndarray
    bytes: np.ndarray
    recover: np.ndarray
    backup: np.ndarray | None = None
    recover_backup: np.ndarray | None = None
    backup_probability: float = 0.0
    """Chance that a failure destroys the primary tier, forcing the backup."""
    composite: Composite | None = None
    """The copies a recovery at each position loads (LayerCheck's composite,
    ``sim.composite``); None: a recovery loads a consistent state of step c."""
    cadence: Cadence | None = None
    footprint: Footprint = Footprint()
    """Host memory, durable bytes and stored bytes (``Strategy._footprint``)."""

    @property
    def steps(self) -> int:
        return int(self.compute.size - 1)

    def stale_s(self, c: int, j: int) -> float:
        """Training time whose updates a recovery at position c discards through stale
        layers, when the run last resumed at j <= c (``Composite.stale_s``); 0 for a
        consistent recovery point."""
        if self.composite is None or c == 0:
            return 0.0
        return float(self.composite.stale_s(np.cumsum(self.compute), c, j))


@dataclass(kw_only=True)
class _Builder:
    workload: Workload
    costs: CostModel
    cadence: Cadence | None
    snap: np.ndarray
    persist: np.ndarray
    commit: np.ndarray
    bytes: np.ndarray
    backup: np.ndarray | None = None
    queued: int = 0
    """The most writes a strategy's own writer queue held at once (LowDiff's), where
    ``_checkpoints`` lays one out."""

    @property
    def steps(self) -> int:
        return self.workload.steps

    @property
    def full(self) -> float:
        return float(self.workload.full_bytes)

    def every(self, k: int) -> np.ndarray:
        """Step numbers k, 2k, ... below N (step N is the job's end)."""
        return np.arange(k, self.steps, k)


class Strategy:
    """Base class: ``schedule`` checks its inputs, delegates to the hooks, checks the result."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    """One line for reports: what the strategy models."""
    rollback: ClassVar[bool] = False
    """Whether it checkpoints on a cadence (and so rolls back to its last checkpoint)."""
    needs_trace: ClassVar[bool] = False
    compared: ClassVar[bool] = True
    """Whether a run that names no strategies runs it (the paper's comparison); False: a
    strategy from elsewhere in the literature, run when named (``--strategies``)."""
    storage_tier: ClassVar[str | None] = None
    """The ``Schedule`` array that carries its writes to shared storage ('snap': a
    synchronous save, 'persist': the background writer, 'backup': a non-blocking tier),
    which ``sim.storage.contended`` re-times; None: none, or timed by its own writer."""

    # -- cadence -----------------------------------------------------------------
    def cadence(self, protocol: str, workload: Workload, costs: CostModel, *,
                mtbf_s: float | None, interval: int | None = None) -> Cadence | None:
        """How often this strategy checkpoints: every ``interval`` steps when given, else
        by ``protocol``. None for strategies without a cadence."""
        if not self.rollback:
            return None
        if interval is not None:
            return self._fixed(int(interval), workload, costs, mtbf_s)
        if protocol == "matched":
            if workload.staleness is None:
                raise SimError("protocol 'matched' needs a trace (LayerCheck's staleness): use a "
                               "preset or --trace, or --protocol native, or --interval STEPS")
            return self._fixed(max(1, round(workload.staleness)), workload, costs, mtbf_s)
        if protocol == "native":
            return self._native(workload, costs, mtbf_s)
        raise SimError(f"protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")

    def _fixed(self, k: int, workload: Workload, costs: CostModel, mtbf_s: float | None) -> Cadence:
        return Cadence(every=k)

    def _native(self, workload: Workload, costs: CostModel, mtbf_s: float | None) -> Cadence:
        raise NotImplementedError

    # -- the fair comparison's search (sim.settings) ------------------------------
    def search_centres(self, workload: Workload, costs: CostModel,
                       mtbf_s: float) -> tuple[int, int | None]:
        """Where theory puts its interval, and a second tier's (None: none). Default:
        Daly's for a synchronous full checkpoint (DeepSpeed, CheckFreq)."""
        return _daly_steps(costs.save_s(workload.full_bytes), workload, mtbf_s), None

    def search_cadences(self, centre: int, storage: int | None, workload: Workload,
                        costs: CostModel) -> list[Cadence]:
        """The search's own cadences around ``search_centres``. Default: a ladder of
        intervals."""
        return [Cadence(every=k) for k in ladder(centre, workload.steps)]

    def spelled(self, cadence: Cadence, costs: CostModel) -> Cadence:
        """``cadence`` with what None stands for spelled out (one cadence, one point).
        Default: as it is."""
        return cadence

    # -- the paper's per-iteration regime (sim.paper) ----------------------------
    def paper_cadence(self, workload: Workload) -> Cadence | None:
        """Its cadence when it checkpoints every iteration, as the paper's runs did: a
        rollback strategy every step with no storage tier within the run (GEMINI's last
        resort); None for strategies without a cadence."""
        return Cadence(every=1, storage_every=workload.steps) if self.rollback else None

    def paper_costs(self, costs: CostModel) -> CostModel:
        """``costs`` as the paper's runs set its own knobs (none here)."""
        return costs

    def training_s(self, workload: Workload, costs: CostModel) -> float:
        """Seconds its training pays beyond compute on one failure-free job whether it
        checkpoints or not (none here; LowDiff's compressed training): outside the
        checkpoint share the paper publishes."""
        return 0.0

    # -- schedule ----------------------------------------------------------------
    def schedule(self, workload: Workload, costs: CostModel, cadence: Cadence | None = None) -> Schedule:
        if self.rollback and cadence is None:
            raise SimError(f"{self.name} checkpoints on a cadence: give one (Strategy.cadence)")
        if self.needs_trace and not workload.has_trace:
            raise SimError(f"{self.name} needs a trace of layer writes: use a preset or --trace, "
                           "or leave it out with --strategies")
        n = workload.steps
        b = _Builder(workload=workload, costs=costs, cadence=cadence,
                     snap=np.zeros(n + 1), persist=np.zeros(n + 1),
                     commit=np.zeros(n + 1, dtype=bool), bytes=np.zeros(n + 1))
        self._checkpoints(b)
        self._backup(b)
        for array in (b.snap, b.persist, b.commit, b.bytes):
            array[0] = array[n] = 0
        if b.backup is not None:
            b.backup[0] = b.backup[n] = np.nan
        composite = self._stale(b)
        footprint = dataclasses.replace(self._footprint(b), moved_bytes=float(b.bytes.sum()))
        recover, recover_backup = self._recovery(b), self._recovery_backup(b)
        for array in (recover, recover_backup):
            if array is not None:
                # a resume past the start pays the new process's first-step warm-up; at the
                # job's start the restarted process builds its initial model and re-runs
                # step 1, whose compute already holds the warm-up
                array[1:] += workload.warmup_s
                array[0] = costs.restart_s
        return Schedule(strategy=self.name, compute=np.concatenate(([0.0], workload.compute_s)),
                        snap=b.snap, persist=b.persist, commit=b.commit, bytes=b.bytes,
                        recover=recover, backup=b.backup, recover_backup=recover_backup,
                        backup_probability=self._backup_probability(b),
                        composite=composite, cadence=cadence, footprint=footprint)

    # hooks -------------------------------------------------------------------
    def _checkpoints(self, b: _Builder) -> None:
        """Fill snap/persist/commit/bytes (see the module contract)."""

    def _backup(self, b: _Builder) -> None:
        """Optionally fill ``b.backup`` (a non-blocking second tier)."""

    def _recovery(self, b: _Builder) -> np.ndarray:
        """Seconds to recover when resuming at position j (N+1 entries; position 0, the
        job's start, costs the restart alone whatever this returns). Default: restart,
        then load a full checkpoint."""
        return np.full(b.steps + 1, b.costs.restart_s + b.costs.load_s(b.full))

    def _recovery_backup(self, b: _Builder) -> np.ndarray | None:
        return None

    def _backup_probability(self, b: _Builder) -> float:
        return 0.0

    def _stale(self, b: _Builder) -> Composite | None:
        """A recovery point's stale layers (LayerCheck's composite); none by default."""
        return None

    def _footprint(self, b: _Builder) -> Footprint:
        """Default: every byte of ``b.bytes`` is durable, no host memory is held, a
        recovery point is a full checkpoint (none without checkpoints)."""
        durable = float(b.bytes.sum())
        return Footprint(durable_bytes=durable, point_bytes=b.full if durable > 0 else 0.0)


def _daly_steps(checkpoint_s: float, workload: Workload, mtbf_s: float | None) -> int:
    """Daly's optimal interval for a checkpoint taking ``checkpoint_s``, in steps."""
    if mtbf_s is None:
        raise SimError("a native cadence needs an MTBF (or a failure log)")
    step_s = float(workload.compute_s.mean())
    steps = daly_interval_s(checkpoint_s, mtbf_s) / step_s + 0.5
    # compared before the floor: an interval past the job (a huge MTBF) is the whole job
    return max(1, workload.steps if not steps < workload.steps else math.floor(steps))


STRATEGIES: tuple = ()
"""The base models no strategy of its own."""
