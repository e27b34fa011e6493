"""CheckFreq's two-phase save, and the figures of its snapshot, persist and load."""
from __future__ import annotations

import numpy as np

from layercheck.contract.figure import Figure, FigureSpec

from .base import Cadence, Footprint, Strategy, _Builder
from .bands import COPY_BAND, COPY_RULE, READ_BAND, STORAGE_RULE, WRITE_BAND

__all__ = ["CheckFreq", "CHECKFREQ_OVERHEAD", "FIGURES", "STRATEGIES"]

FIGURES: dict[str, FigureSpec] = {
    "snapshot_gbps": FigureSpec("GB/s", "checkfreq", "the blocking first phase of a two-phase "
                                                     "save: the state copied to host memory",
        band=COPY_RULE,
        default=Figure(value=100.0, source="assumed", method=(
        "GPU -> pinned host memory: 8 GPUs x 12.5 GB/s, about half of PCIe 4.0 x16's 25 GB/s "
        "per A100"), band=COPY_BAND)),
    "persist_gbps": FigureSpec("GB/s", "checkfreq, gemini (storage tier), lowdiff",
                               "the background second phase: host memory to storage",
        band=STORAGE_RULE,
        default=Figure(value=1.24, source="derived", method="the same Lustre writes as save_gbps", band=WRITE_BAND)),
    "async_load_gbps": FigureSpec("GB/s", "checkfreq", "loading a checkpoint written by the "
                                                       "two-phase save",
        band=STORAGE_RULE,
        default=Figure(value=17.9, source="fit", method="the same Lustre reads as load_gbps", band=READ_BAND)),
}
"""The figures this module declares (``sim.calibrated.FIGURES`` is the union)."""


CHECKFREQ_OVERHEAD = 0.035
"""CheckFreq tunes its interval so that checkpointing costs at most this share of
training time: "bounding the runtime overhead within 3.5%" (Mohan et al., FAST 2021)."""


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

    def _footprint(self, b: _Builder) -> Footprint:
        """Its snapshot buffer in host memory holds one full copy of the state."""
        durable = float(b.bytes.sum())
        return Footprint(durable_bytes=durable, host_bytes=b.full, point_bytes=b.full)


STRATEGIES = (CheckFreq,)
"""The strategies this module models (``sim.strategies.STRATEGIES`` is every module's)."""
