"""What one failure costs a job of N nodes before it trains again, and where each figure comes from.

A failure event (``times_s``, ``nodes_lost``: a rack takes several nodes at once)
costs, in order:

1. **detection**: a crash is noticed by the launcher; a hang only when a
   collective's timeout expires (``hang_share`` of failures pay ``hang_timeout_s``);
2. **rescheduling**: with a hot spare free for every lost node, host selection;
   without enough spares the job waits until enough nodes are back from repair
   (``no_spare="wait"``), or restarts at once on the nodes left
   (``no_spare="shrink"``) and runs short of the lost nodes until they are back;
3. **process start and communicator init**: the cost model's one-node restart
   plus NCCL's init growth per doubling of the node count;
4. **the checkpoint load**: the strategy's own (``sim.strategies``), its bandwidth
   the shared storage's at N nodes (``sim.storage``).

Steps 1-2 vary per event and are the engine's ``downtime`` (``sim.engine``);
3-4 are the schedule's ``recover``. Every default carries its source in
``RECOVERY_FIGURES`` (shared/design/SCALE.md gathers them). The spare pool is
kept over time: a lost node's spare returns to the pool when the lost node is
repaired (``repair_s`` after the failure).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from layercheck.contract.calibration import Figure

from .errors import SimError
from .units import DURATION_RANGE, is_duration

__all__ = ["RecoveryModel", "Downtime", "RECOVERY_FIGURES", "GPUS_PER_NODE", "NO_SPARE"]

GPUS_PER_NODE = 8
"""GPUs per node: the paper's server (8x A100) and Llama 3's hosts (8x H100)."""
NO_SPARE = ("wait", "shrink")

RECOVERY_FIGURES: dict[str, Figure] = {
    "hang_share": Figure(value=0.10, source="published", method=(
        "ByteRobust (ByteDance, SOSP 2025): hangs are 10% of incidents (CUDA errors 36%); the "
        "rest end the process and are noticed at once")),
    "hang_timeout_s": Figure(value=600.0, source="published", method=(
        "a hang is found by the collective's timeout, commonly ~10 min (shared/design/SCALE.md; "
        "PyTorch's default NCCL process-group timeout is 10 min). Constant in N")),
    "crash_detect_s": Figure(value=30.0, source="published", method=(
        "ByteRobust (SOSP 2025) detects network faults in ~30 s; taken for every failure that "
        "is not a hang (a crash is noticed by the launcher at least as fast). Constant in N")),
    "host_selection_s": Figure(value=180.0, source="published", method=(
        "AIReSim's default host selection, 3 min (karthikp-ubc/airesim): a hot spare replaces "
        "a failed node. Constant in N (one selection per event, whatever it lost)")),
    "repair_s": Figure(value=7200.0, source="published", method=(
        "AIReSim's default automatic repair, 120 min (karthikp-ubc/airesim; manual repair: 2 "
        "days): when a lost node is back (its spare returns to the pool)")),
    "comm_init_per_doubling_s": Figure(value=2.59, source="derived", method=(
        "NVIDIA/nccl#534: creating 7 communicators took 31.3 s on 1 machine and 41.7 s on 16, "
        "(41.674 - 31.316) / log2(16) = 2.59 s per doubling of the node count, added to the "
        "cost model's one-node restart: 58 s at 2,048 nodes (16,384 GPUs) on paper-a100's 30 s. "
        "NVIDIA/nccl#1156 reports 2.5 min of init above some thousands of GPUs: this growth "
        "may be optimistic there (--comm-init-per-doubling)")),
}
"""Every default of ``RecoveryModel``: value, source and method (the docs print them)."""


def _default(name: str) -> float:
    return RECOVERY_FIGURES[name].value


@dataclass(frozen=True)
class Downtime:
    """Per event: seconds from the failure until the restart begins, and their parts."""

    detection_s: np.ndarray
    reschedule_s: np.ndarray
    """Host selection, or the wait for repair, or (shrink) the lost capacity's equivalent."""

    @property
    def total_s(self) -> np.ndarray:
        return self.detection_s + self.reschedule_s


@dataclass(frozen=True, kw_only=True)
class RecoveryModel:
    """How detection, rescheduling and restart grow with the job (module docstring)."""

    hang_share: float = _default("hang_share")
    hang_timeout_s: float = _default("hang_timeout_s")
    crash_detect_s: float = _default("crash_detect_s")
    host_selection_s: float = _default("host_selection_s")
    repair_s: float = _default("repair_s")
    comm_init_per_doubling_s: float = _default("comm_init_per_doubling_s")
    spares: int | None = None
    """Hot spare nodes in the pool; None: never exhausted (an assumption; say so)."""
    no_spare: Literal["wait", "shrink"] = "wait"
    """Without a spare: wait for repair, or restart smaller (elastic)."""

    def __post_init__(self) -> None:
        for name in RECOVERY_FIGURES:
            value = getattr(self, name)
            if name == "hang_share":
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not 0 <= value <= 1:
                    raise SimError(f"recovery hang_share={value!r}: a share in [0, 1]")
            elif not is_duration(value, allow_zero=True):
                raise SimError(f"recovery {name}={value!r}: give 0 or a number of seconds "
                               f"from {DURATION_RANGE}")
        if self.spares is not None and not _whole(self.spares, 0):
            raise SimError(f"spares={self.spares!r}: give a whole number of nodes >= 0 "
                           "(or none for a pool that never runs out)")
        if self.no_spare not in NO_SPARE:
            raise SimError(f"no_spare={self.no_spare!r}: use one of {', '.join(NO_SPARE)}")

    def restart_s(self, one_node_restart_s: float, nodes: int) -> float:
        """Process start and communicator init on ``nodes`` nodes: the one-node restart
        plus ``comm_init_per_doubling_s`` per doubling (log2 growth, nccl#534)."""
        _check_nodes(nodes)
        return one_node_restart_s + self.comm_init_per_doubling_s * math.log2(nodes)

    @property
    def mean_detection_s(self) -> float:
        return self.hang_share * self.hang_timeout_s + (1 - self.hang_share) * self.crash_detect_s

    def downtime(self, times_s: np.ndarray, nodes_lost: np.ndarray, nodes: int,
                 rng: np.random.Generator) -> Downtime:
        """Detection and rescheduling of each event (ascending ``times_s``), the spare pool
        kept over time; ``rng`` decides which failures hang."""
        _check_nodes(nodes)
        times = np.asarray(times_s, dtype=float)
        lost = np.asarray(nodes_lost, dtype=np.int64)
        if times.shape != lost.shape or (lost < 1).any():
            raise SimError("failure events: one nodes_lost >= 1 per failure time")
        hang = rng.random(times.size) < self.hang_share
        detection = np.where(hang, self.hang_timeout_s, self.crash_detect_s)
        return Downtime(detection_s=detection, reschedule_s=self._reschedule(times, lost, nodes))

    def _reschedule(self, times: np.ndarray, lost: np.ndarray, nodes: int) -> np.ndarray:
        """Host selection, plus, when the pool lacks a spare for every lost node, the wait
        (or, shrinking, the lost capacity) until the nodes missing are back from repair. A
        lost node returns ``repair_s`` after its failure; a returned node refills the pool,
        unless the job is waiting for (or short of) it, then it rejoins the job."""
        if self.spares is None:
            return np.full(times.size, self.host_selection_s)
        out = np.empty(times.size)
        free, back = int(self.spares), []     # back: times lost nodes return from repair (heap)
        for k, (t, n) in enumerate(zip(times.tolist(), lost.tolist())):
            while back and back[0] <= t:
                heapq.heappop(back)
                free += 1
            repaired = t + self.repair_s
            for _ in range(n):
                heapq.heappush(back, repaired)
            short = max(0, n - free)          # nodes the pool cannot give now
            free -= n - short
            # the missing nodes rejoin the job as they come back from repair
            out[k] = self.host_selection_s + self._short_s(
                [heapq.heappop(back) for _ in range(short)], t, nodes)
        return out

    def _short_s(self, returns: list[float], t: float, nodes: int) -> float:
        """What being short of the nodes back at ``returns`` costs an event at ``t``: 0 with
        none short; waiting, until the last is back; shrinking, each missing node's share
        of the job until it is back, charged as downtime (exact while no other failure
        falls in between: the engine sees the job at full speed after its downtime)."""
        if not returns:
            return 0.0
        if self.no_spare == "wait":
            return returns[-1] - t
        return sum(r - t for r in returns) / nodes


def _whole(value: object, least: int) -> bool:
    """Whether ``value`` is a whole number (an int, not a bool) of at least ``least``."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= least


def _check_nodes(nodes: int) -> None:
    if not _whole(nodes, 1):
        raise SimError(f"nodes={nodes!r}: a job needs a whole number of nodes >= 1")
