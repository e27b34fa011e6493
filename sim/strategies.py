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

``Strategy.cadence`` says how often a rollback strategy checkpoints under a
protocol: ``matched`` (the paper's matched freshness), ``native`` (as its
authors designed it: the ``_native`` hook) or a fixed interval.

No strategy has a recovery point before its first durable checkpoint:
position 0 (the job's start) is where a failure before it resumes, and
resuming there costs only the restart (``restart_s`` builds the model from
its initial weights; there is no checkpoint to load). Step N is the job's end: the training script's own final save
commits it, the same for every strategy, so no strategy is charged a
checkpoint there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .costs import CostModel
from .errors import SimError
from .theory import daly_interval_s
from .writer import queued_writer
from .workload import Workload

__all__ = ["Cadence", "Schedule", "Strategy", "STRATEGIES", "get_strategy", "PROTOCOLS",
           "CHECKFREQ_OVERHEAD", "NATIVE_DIFF_BATCH"]

PROTOCOLS = ("matched", "native")
"""matched: rollback strategies checkpoint every ``round(staleness)`` steps, LayerCheck's
mean parameter-weighted staleness on the same trace (the paper's comparison); native:
each strategy as its authors designed it (``Strategy._native``)."""

NATIVE_DIFF_BATCH = 1
"""LowDiff's differentials per write as its authors ran it: ``SAVE_BATCH_FREQ=1`` in
its scripts (Chenxuan-Yao/TPDS-LowDiff, scripts/run_qwen_lowdiff_topk.sh)."""

CHECKFREQ_OVERHEAD = 0.035
"""CheckFreq tunes its interval so that checkpointing costs at most this share of
training time: "bounding the runtime overhead within 3.5%" (Mohan et al., FAST 2021)."""


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
    stale_last: np.ndarray | None = None
    """(N+1) x layers: the step whose copy of each layer a recovery at position c loads
    (LayerCheck's composite); None: a recovery loads a consistent state of step c."""
    stale_weights: np.ndarray | None = None
    """Each layer's share of the parameters (weights of ``stale_s``)."""
    cadence: Cadence | None = None

    @property
    def steps(self) -> int:
        return int(self.compute.size - 1)

    def stale_s(self, c: int, j: int) -> float:
        """Training time whose updates a recovery at position c discards through stale
        layers, when the run last resumed at j <= c: per layer, the compute of the steps
        after its copy (or after j, where the restored layers equalled their copies) up to
        c, weighted by its parameter share. 0 for a consistent recovery point."""
        if self.stale_last is None or c == 0:
            return 0.0
        work = np.cumsum(self.compute)
        since = np.maximum(self.stale_last[c], min(j, c))
        return float((work[c] - work[since]) @ self.stale_weights)


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
        last, weights = self._stale(b)
        recover, recover_backup = self._recovery(b), self._recovery_backup(b)
        for array in (recover, recover_backup):
            if array is not None:  # the job's start: the restarted process built its initial model
                array[0] = costs.restart_s
        return Schedule(strategy=self.name, compute=np.concatenate(([0.0], workload.compute_s)),
                        snap=b.snap, persist=b.persist, commit=b.commit, bytes=b.bytes,
                        recover=recover, backup=b.backup, recover_backup=recover_backup,
                        backup_probability=self._backup_probability(b),
                        stale_last=last, stale_weights=weights, cadence=cadence)

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

    def _stale(self, b: _Builder) -> tuple[np.ndarray | None, np.ndarray | None]:
        """A recovery point's stale layers (LayerCheck's composite); none by default."""
        return None, None


def _daly_steps(checkpoint_s: float, workload: Workload, mtbf_s: float | None) -> int:
    """Daly's optimal interval for a checkpoint taking ``checkpoint_s``, in steps."""
    if mtbf_s is None:
        raise SimError("a native cadence needs an MTBF (or a failure log)")
    step_s = float(workload.compute_s.mean())
    tau = daly_interval_s(checkpoint_s, mtbf_s)
    return max(1, min(workload.steps, math.floor(tau / step_s + 0.5)))


class NoCheckpoint(Strategy):
    """No checkpoints: a failure restarts the job from step 0."""
    name = "none"
    label = "no checkpoints: a failure restarts the job"


class DeepSpeed(Strategy):
    """DeepSpeed default: a synchronous full checkpoint every ``every`` steps; training
    stalls for the whole write. Native: Daly's interval for that write."""
    name = "deepspeed"
    label = "synchronous full save (engine.save_checkpoint)"
    rollback = True
    storage_tier = "snap"

    def _native(self, workload, costs, mtbf_s) -> Cadence:
        return Cadence(every=_daly_steps(costs.save_s(workload.full_bytes), workload, mtbf_s))

    def _checkpoints(self, b: _Builder) -> None:
        at = b.every(b.cadence.every)
        b.snap[at] = b.costs.save_s(b.full)
        b.commit[at] = True
        b.bytes[at] = b.full


class CheckFreq(Strategy):
    """CheckFreq (Mohan et al., FAST 2021; msr-fiddle/CheckFreq): its snapshot to host
    memory runs alongside the next iteration's forward and backward pass and only has to
    finish before that iteration's weight update, so training stalls for the part of the
    snapshot longer than one iteration's compute; the persist follows in the background
    and the next snapshot waits for it. Native: its adaptive interval, the most frequent
    one whose cost stays within ``CHECKFREQ_OVERHEAD`` of training time."""
    name = "checkfreq"
    label = "two-phase: snapshot overlapped with the next step, persist in background"
    rollback = True
    storage_tier = "persist"

    def _native(self, workload, costs, mtbf_s) -> Cadence:
        step_s, full = float(workload.compute_s.mean()), workload.full_bytes
        snap, persist = costs.snapshot_s(full), costs.persist_s(full)
        stall = max(0.0, snap - step_s)          # the snapshot overlapped with one iteration
        k = np.arange(1, workload.steps + 1)
        overhead = (stall + np.maximum(0.0, persist - k * step_s)) / (k * step_s)
        fits = np.flatnonzero(overhead <= CHECKFREQ_OVERHEAD)
        return Cadence(every=int(k[fits[0]]) if fits.size else workload.steps)

    def _checkpoints(self, b: _Builder) -> None:
        at = b.every(b.cadence.every)
        snapshot = b.costs.snapshot_s(b.full)
        # step i's snapshot overlaps step i+1's compute (compute_s[i], 0-based): the
        # overlapped part is done before the stall ends, so the persist starts after it
        overlapped = np.minimum(snapshot, b.workload.compute_s[at])
        b.snap[at] = snapshot - overlapped
        b.persist[at] = overlapped + b.costs.persist_s(b.full)
        b.commit[at] = True
        b.bytes[at] = b.full

    def _recovery(self, b: _Builder) -> np.ndarray:
        return np.full(b.steps + 1, b.costs.restart_s + b.costs.async_load_s(b.full))


class Gemini(Strategy):
    """GEMINI: copies to CPU memory (snapshot stall, then the transfer to a peer's memory
    in the background) every ``every`` steps, storage every ``storage_every`` steps as the
    last tier. Recovery from the peer's memory unless the failure took it too
    (``peer_loss_probability``), then from storage. Native: in-memory copies as often as
    the peer transfer keeps up with training; storage at Daly's interval."""
    name = "gemini"
    label = "in-memory copies on a peer, storage as the last tier"
    rollback = True
    storage_tier = "backup"

    def _fixed(self, k, workload, costs, mtbf_s) -> Cadence:
        return Cadence(every=k, storage_every=max(k, self._storage_every(workload, costs, mtbf_s)))

    def _native(self, workload, costs, mtbf_s) -> Cadence:
        transfer = costs.peer_s(workload.full_bytes)
        k = max(1, math.ceil(transfer / float(workload.compute_s.mean()) - 1e-9))
        return self._fixed(min(k, workload.steps), workload, costs, mtbf_s)

    @staticmethod
    def _storage_every(workload, costs, mtbf_s) -> int:
        return _daly_steps(costs.persist_s(workload.full_bytes), workload, mtbf_s)

    def _checkpoints(self, b: _Builder) -> None:
        at = b.every(b.cadence.every)
        b.snap[at] = b.costs.host_copy_s(b.full)
        b.persist[at] = b.costs.peer_s(b.full)
        b.commit[at] = True
        b.bytes[at] = b.full

    def _backup(self, b: _Builder) -> None:
        b.backup = np.full(b.steps + 1, np.nan)
        at = b.every(b.cadence.storage_every)
        b.backup[at] = b.costs.persist_s(b.full)
        b.bytes[at] += b.full

    def _recovery(self, b: _Builder) -> np.ndarray:
        return np.full(b.steps + 1, b.costs.restart_s + b.costs.peer_load_s(b.full))

    def _recovery_backup(self, b: _Builder) -> np.ndarray:
        # the storage tier is written in the background from the host copy at persist_gbps
        # (the two-phase persist), so it is read back as a two-phase save is
        return np.full(b.steps + 1, b.costs.restart_s + b.costs.async_load_s(b.full))

    def _backup_probability(self, b: _Builder) -> float:
        return b.costs.peer_loss_probability


class LowDiff(Strategy):
    """LowDiff (Yao et al.; Chenxuan-Yao/TPDS-LowDiff) as its code runs: training is
    compressed (top-k gradients), and every step the compressed gradient is handed to a
    separate writer process through a queue (``diff_snapshot_gbps``: the training-side
    stall, compression and hand-off); the writer writes the diffs in batches of
    ``diff_batch`` steps, one after another, while training goes on, so training never
    waits for a write, only for the queue when ``queue_batches`` batches are pending
    (unbounded in its code: ``mp.Queue()``). A full checkpoint every ``every`` steps is a
    synchronous save on the training thread (``torch.save`` in the loop), served by the
    storage after the writer's backlog. Recovery loads the newest full checkpoint and
    replays the differentials since it. Native: its tuning of the full-checkpoint interval
    and the batch size (``_native``)."""
    name = "lowdiff"
    label = "per-step compressed gradient differentials, queue-fed writer, periodic full saves"
    rollback = True
    queue_batches: int | None = None
    """Batches the queue holds before training waits (None: unbounded, as in its code)."""

    def __init__(self, queue_batches: int | None = None) -> None:
        if queue_batches is not None and (isinstance(queue_batches, bool) or queue_batches < 1):
            raise SimError(f"LowDiff queue_batches={queue_batches!r}: use a whole number >= 1 "
                           "or None (unbounded)")
        self.queue_batches = queue_batches

    def _native(self, workload, costs, mtbf_s) -> Cadence:
        """Full checkpoints every F steps, F minimising the time a full checkpoint costs per
        step plus the replay a failure costs per step, C / (F s) + (F / 2) r / M (C: the
        synchronous full save, s: a step, r: replaying one step's differential, M: the
        MTBF): F = sqrt(2 C M / (s r)), the trade-off LowDiff tunes. Its batch size only
        amortises a per-write cost the model has none of, so it stays at its scripts'
        default (``NATIVE_DIFF_BATCH``)."""
        if mtbf_s is None:
            raise SimError("a native cadence needs an MTBF (or a failure log)")
        step_s = float(workload.compute_s.mean())
        full = costs.save_s(workload.full_bytes)
        replay = costs.diff_fraction * workload.full_bytes / (costs.diff_replay_gbps * 1e9)
        every = math.floor(math.sqrt(2 * full * mtbf_s / (step_s * replay)) + 0.5)
        return Cadence(every=max(1, min(workload.steps, every)), batch=NATIVE_DIFF_BATCH)

    def _diff_bytes(self, b: _Builder) -> float:
        return b.costs.diff_fraction * b.full

    def _checkpoints(self, b: _Builder) -> None:
        c, full, diff = b.costs, b.full, self._diff_bytes(b)
        b.snap[b.every(1)] = diff / (c.diff_snapshot_gbps * 1e9)
        fulls = b.every(b.cadence.every)
        batch = b.cadence.batch or c.diff_batch
        batches = b.every(batch)
        b.bytes[batches] = diff * batch
        b.bytes[fulls] += full
        b.commit[fulls] = True          # synchronous: durable when its stall ends
        write = np.zeros(b.steps + 1)
        write[batches] = c.persist_s(diff * batch)
        is_full = np.zeros(b.steps + 1, dtype=bool)
        is_full[fulls] = True
        b.backup = queued_writer(b.workload.compute_s, b.snap, write, is_full,
                                 c.save_s(full), self.queue_batches)

    def _recovery(self, b: _Builder) -> np.ndarray:
        positions = np.arange(b.steps + 1)
        last_full = (positions // b.cadence.every) * b.cadence.every
        replay = (positions - last_full) * self._diff_bytes(b) / (b.costs.diff_replay_gbps * 1e9)
        # before the first full checkpoint the diffs replay onto the initial model
        load = np.where(last_full > 0, b.costs.load_s(b.full), 0.0)
        return b.costs.restart_s + load + replay

    def _recovery_backup(self, b: _Builder) -> np.ndarray:
        return self._recovery(b)


class LayerCheck(Strategy):
    """LayerCheck as the library runs it: drift tracking on every step; from the base
    checkpoint on, at every opportunity the layers the trace wrote are copied to host
    memory (stall) and the background writer persists them and commits the step's
    training state. A step is a recovery point once that state is durable; recovery
    loads the composite of the newest copy of every layer, whose stale layers discard
    the updates since their copy (``Schedule.stale_s``)."""
    name = "layercheck"
    label = "layer-wise, background writer (the layercheck library)"
    needs_trace = True
    storage_tier = "persist"
    synchronous: ClassVar[bool] = False

    def _checkpoints(self, b: _Builder) -> None:
        c, layers = b.costs, b.workload.layers
        writes = np.concatenate(([0.0], layers.bytes_per_step))
        commits = layers.commits()
        b.snap[1:] = c.tracking_fraction * b.workload.compute_s
        write = np.where(commits, writes / (c.lc_write_gbps * 1e9) + c.lc_commit_s, 0.0)
        b.snap += np.where(commits, writes / (c.lc_snapshot_gbps * 1e9), 0.0)
        if self.synchronous:
            b.snap += write
        else:
            b.persist[:] = write
        b.commit[:] = commits
        b.bytes[:] = np.where(commits, writes, 0.0)

    def _recovery(self, b: _Builder) -> np.ndarray:
        return np.full(b.steps + 1, b.costs.restart_s + b.costs.lc_load_s(b.full))

    def _stale(self, b: _Builder) -> tuple[np.ndarray, np.ndarray]:
        return b.workload.layers.last, b.workload.layers.weights


class LayerCheckSync(LayerCheck):
    """LayerCheck as the paper's implementation ran it: the same layers, written
    synchronously on the training thread (the paper's end-to-end times)."""
    name = "layercheck-sync"
    label = "layer-wise, synchronous writes (the paper's implementation)"
    synchronous = True
    storage_tier = "snap"


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (NoCheckpoint, DeepSpeed, CheckFreq, Gemini, LowDiff, LayerCheck,
                              LayerCheckSync)}
"""Every strategy by name, in report order."""


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise SimError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None
