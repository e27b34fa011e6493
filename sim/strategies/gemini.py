"""GEMINI's in-memory copies on a peer, and the figures of its copy, transfer and peer loss."""
from __future__ import annotations

import math

import numpy as np

from layercheck.contract.figure import Figure, FigureSpec
from ..placement import HOST_LOSS_SHARE, HOST_LOSS_SOURCE
from layercheck.contract.band import Band

from .base import Cadence, Footprint, Strategy, _Builder, _daly_steps, ladder
from .bands import COPY_BAND, COPY_RULE, PAPER

__all__ = ["Gemini", "FIGURES", "STRATEGIES"]

FIGURES: dict[str, FigureSpec] = {
    "host_copy_gbps": FigureSpec("GB/s", "gemini, lowdiff (full checkpoints)",
                                 "a plain copy of the full state into host memory",
        band=COPY_RULE,
        default=Figure(value=100.0, source="assumed", method=(
        "the same GPU -> pinned host memory copy as snapshot_gbps"), band=COPY_BAND)),
    "peer_gbps": FigureSpec("GB/s", "gemini", "the transfer of the in-memory copy to a peer "
                                              "node's CPU memory (and back on recovery)",
        band=Band(low=1.25, high=25.0, reason=(
            "a peer node's CPU memory over the network: from 10 Gb/s Ethernet (1.25 GB/s) to "
            "one 200 Gb/s HDR InfiniBand port (25 GB/s)")),
        default=Figure(value=4.19, source="fit", method=(
        f"{PAPER}: GEMINI's per-iteration Qwen2.5-7B run took 747.9 min: 26.52 s per iteration "
        "= 1.07 s snapshot + max(6.25 s compute, transfer), so its checkpoint traffic moved "
        "106.6 GB in 25.45 s"))),
    "peer_loss_probability": FigureSpec("1", "gemini", "chance that a failure also destroys the "
                                                       "peer's copy (recovery from storage)",
        band=Band(low=0.0, high=0.2, reason=(
            "0: node failures independent, so GEMINI's copy on another node always survives; "
            "0.2: a judgment (no published figure), one failure in five from a fault domain "
            "wider than a node (a switch, a rack's power) that holds the peer too")),
        default=Figure(value=round(HOST_LOSS_SHARE, 4), source="derived", method=(
        f"sim.placement: on the paper's one server GEMINI's replicas share a host's memory, so "
        f"every failure that takes a host's memory takes them: {HOST_LOSS_SOURCE}, "
        f"32 / 419 = {HOST_LOSS_SHARE:.4f} (on different hosts it would be that share x the "
        "chance the peer's host fails before the copy is re-made)"))),
}
"""The figures this module declares (``sim.calibrated.FIGURES`` is the union)."""


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

    def search_centres(self, workload, costs, mtbf_s) -> tuple[int, int]:
        """Its copies as often as its transfer keeps up, Daly's interval for the persist
        behind them."""
        memory = max(1, round(costs.peer_s(workload.full_bytes) / float(workload.compute_s.mean())))
        return memory, self._storage_every(workload, costs, mtbf_s)

    def search_cadences(self, centre, storage, workload, costs) -> list[Cadence]:
        """Its memory ladder times its storage ladder."""
        n = workload.steps
        return [Cadence(every=m, storage_every=max(m, s)) for m in ladder(centre, n, doublings=2)
                for s in ladder(storage, n, per_doubling=1, doublings=2)]

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

    def _footprint(self, b: _Builder) -> Footprint:
        """Durable: its storage tier only (the copies to a peer's memory are not). Host
        memory: its own copy and the one it keeps for its peer (GEMINI's two replicas, the
        m = 2 its paper argues covers most failures)."""
        stored = int(np.isfinite(b.backup).sum())
        return Footprint(durable_bytes=stored * b.full, host_bytes=2 * b.full, point_bytes=b.full)


STRATEGIES = (Gemini,)
"""The strategies this module models (``sim.strategies.STRATEGIES`` is every module's)."""
