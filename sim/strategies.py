"""Checkpointing strategies as small classes behind one base.

A strategy turns a job (``Workload``) and a cost model into a ``Plan``: what
checkpointing costs after each step and what a recovery costs from each
position. The engines (``engine`` fast, ``reference`` SimPy) execute plans; no
strategy knows about failures.

Contract of ``Strategy.plan`` (the only public method; subclasses override
the hooks, called in this order):

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

Step N is the job's end: the training script's own final save commits it, the
same for every strategy, so no strategy is charged a checkpoint there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .costs import CostModel
from .errors import SimError
from .workload import Workload

__all__ = ["Plan", "Strategy", "STRATEGIES", "get_strategy", "ROLLBACK"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A strategy's costs on one job; arrays have N+1 entries, index i = after step i."""

    strategy: str
    compute: np.ndarray
    snap: np.ndarray
    persist: np.ndarray
    commit: np.ndarray
    bytes: np.ndarray
    recover: np.ndarray
    commit_on_completion: bool = False
    """True: step i is a recovery point as soon as its compute completes (LayerCheck:
    the composite of the newest durable layer copies; no step is ever redone)."""
    backup: np.ndarray | None = None
    recover_backup: np.ndarray | None = None
    backup_probability: float = 0.0
    """Chance that a failure destroys the primary tier, forcing the backup."""

    @property
    def steps(self) -> int:
        return int(self.compute.size - 1)


@dataclass(kw_only=True)
class _Builder:
    workload: Workload
    costs: CostModel
    interval: int
    snap: np.ndarray
    persist: np.ndarray
    commit: np.ndarray
    bytes: np.ndarray
    backup: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return self.workload.steps

    def every(self, k: int) -> np.ndarray:
        """Step numbers k, 2k, ... below N (step N is the job's end)."""
        return np.arange(k, self.steps, k)


class Strategy:
    """Base class: ``plan`` checks its inputs, delegates to the hooks, checks the result."""

    name: ClassVar[str] = ""
    uses_interval: ClassVar[bool] = False
    """Whether ``interval`` (steps between full checkpoints) applies."""
    needs_trace: ClassVar[bool] = False
    commit_on_completion: ClassVar[bool] = False

    def plan(self, workload: Workload, costs: CostModel, *, interval: int = 1) -> Plan:
        if isinstance(interval, bool) or not isinstance(interval, (int, np.integer)) or interval < 1:
            raise SimError(f"{self.name}: interval={interval!r} must be a whole number of steps >= 1")
        if self.needs_trace and not workload.has_trace:
            raise SimError(f"{self.name} needs a trace of layer writes: use a preset or --trace, "
                           "or leave it out with --strategies")
        n = workload.steps
        b = _Builder(workload=workload, costs=costs, interval=int(interval),
                     snap=np.zeros(n + 1), persist=np.zeros(n + 1),
                     commit=np.zeros(n + 1, dtype=bool), bytes=np.zeros(n + 1))
        self._checkpoints(b)
        self._backup(b)
        for array in (b.snap, b.persist, b.commit, b.bytes):
            array[0] = array[n] = 0
        if b.backup is not None:
            b.backup[0] = b.backup[n] = np.nan
        recover = np.asarray(self._recovery(b), dtype=np.float64)
        backup_recover = self._recovery_backup(b)
        compute = np.concatenate(([0.0], workload.compute_s))
        return Plan(strategy=self.name, compute=compute, snap=b.snap, persist=b.persist,
                    commit=b.commit, bytes=b.bytes, recover=recover,
                    commit_on_completion=self.commit_on_completion, backup=b.backup,
                    recover_backup=backup_recover,
                    backup_probability=self._backup_probability(b))

    # hooks -------------------------------------------------------------------
    def _checkpoints(self, b: _Builder) -> None:
        """Fill snap/persist/commit/bytes (see the module contract)."""

    def _backup(self, b: _Builder) -> None:
        """Optionally fill ``b.backup`` (a non-blocking second tier)."""

    def _recovery(self, b: _Builder) -> np.ndarray:
        """Seconds to recover when resuming at position j (N+1 entries).
        Default: restart, then load a full checkpoint (or the initial model)."""
        full = b.costs.restart_s + b.costs.load_s(b.workload.full_bytes)
        return np.full(b.steps + 1, full)

    def _recovery_backup(self, b: _Builder) -> np.ndarray | None:
        return None

    def _backup_probability(self, b: _Builder) -> float:
        return 0.0


class NoCheckpoint(Strategy):
    """No checkpoints: a failure restarts the job from step 0."""
    name = "none"


class DeepSpeed(Strategy):
    """DeepSpeed default: a synchronous full checkpoint every ``interval`` steps;
    training stalls for the whole write."""
    name = "deepspeed"
    uses_interval = True

    def _checkpoints(self, b: _Builder) -> None:
        at = b.every(b.interval)
        b.snap[at] = b.costs.write_s(b.workload.full_bytes)
        b.commit[at] = True
        b.bytes[at] = b.workload.full_bytes


class CheckFreq(Strategy):
    """CheckFreq: snapshot to host memory (stall), persist in the background;
    the next snapshot waits for the previous persist."""
    name = "checkfreq"
    uses_interval = True

    def _checkpoints(self, b: _Builder) -> None:
        at, full = b.every(b.interval), b.workload.full_bytes
        b.snap[at] = b.costs.snapshot_s(full)
        b.persist[at] = b.costs.write_s(full)
        b.commit[at] = True
        b.bytes[at] = full


class Gemini(Strategy):
    """GEMINI: every step to local and peer CPU memory (snapshot stall, then the
    transfer to the peer in the background), storage every ``interval`` steps as
    the last tier. Recovery from the peer's memory unless the failure took it."""
    name = "gemini"
    uses_interval = True

    def _checkpoints(self, b: _Builder) -> None:
        at, full = b.every(1), b.workload.full_bytes
        b.snap[at] = b.costs.snapshot_s(full)
        b.persist[at] = b.costs.peer_s(full)
        b.commit[at] = True
        b.bytes[at] = full

    def _backup(self, b: _Builder) -> None:
        b.backup = np.full(b.steps + 1, np.nan)
        at = b.every(b.interval)
        b.backup[at] = b.costs.write_s(b.workload.full_bytes)
        b.bytes[at] += b.workload.full_bytes

    def _recovery(self, b: _Builder) -> np.ndarray:
        c = b.costs
        return np.full(b.steps + 1, c.restart_s + c.load_fixed_s + c.peer_s(b.workload.full_bytes))

    def _recovery_backup(self, b: _Builder) -> np.ndarray:
        return Strategy._recovery(self, b)

    def _backup_probability(self, b: _Builder) -> float:
        return b.costs.peer_loss_probability


class LowDiff(Strategy):
    """LowDiff: a compressed gradient diff every step (snapshot stall), written in
    batches of ``diff_batch`` steps, a full checkpoint every ``interval`` steps,
    all through one background writer. Recovery loads the newest full checkpoint
    and replays the diffs since it."""
    name = "lowdiff"
    uses_interval = True

    def _diff_bytes(self, b: _Builder) -> float:
        return b.costs.diff_fraction * b.workload.full_bytes

    def _checkpoints(self, b: _Builder) -> None:
        c, full, diff = b.costs, b.workload.full_bytes, self._diff_bytes(b)
        b.snap[b.every(1)] = c.snapshot_s(diff)
        batches = b.every(c.diff_batch)
        b.persist[batches] = c.write_s(diff * c.diff_batch)
        b.bytes[batches] = diff * c.diff_batch
        fulls = b.every(b.interval)
        b.snap[fulls] += c.snapshot_s(full)
        b.persist[fulls] = c.write_s(full)  # a full checkpoint supersedes the batch
        b.bytes[fulls] = full
        b.commit[batches] = True
        b.commit[fulls] = True

    def _recovery(self, b: _Builder) -> np.ndarray:
        positions = np.arange(b.steps + 1)
        last_full = (positions // b.interval) * b.interval
        replay = (positions - last_full) * self._diff_bytes(b)
        return Strategy._recovery(self, b) + replay / (b.costs.diff_replay_gbps * 1e9)


class LayerCheck(Strategy):
    """LayerCheck: after every step the per-step cost (drift, metadata), then a
    snapshot of the layers the trace wrote at that step, persisted in the
    background. Every completed step is a recovery point (the composite of the
    newest durable layer copies): a failure loses only the step in flight."""
    name = "layercheck"
    needs_trace = True
    commit_on_completion = True

    def _checkpoints(self, b: _Builder) -> None:
        c, writes = b.costs, np.concatenate(([0.0], b.workload.layercheck_bytes))
        b.snap[1:] = c.layercheck_step_fraction * b.workload.compute_s
        b.snap += writes / (c.host_copy_gbps * 1e9)
        b.persist[:] = writes / (c.write_gbps * 1e9)
        b.commit[:] = True
        b.bytes[:] = writes


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (NoCheckpoint, DeepSpeed, CheckFreq, Gemini, LowDiff, LayerCheck)}
"""Every strategy by name, in report order."""

ROLLBACK = tuple(name for name, cls in STRATEGIES.items() if cls.uses_interval)


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise SimError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None
