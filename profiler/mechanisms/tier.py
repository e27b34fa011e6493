"""tiered: the memory tier's copy of the whole training state into tmpfs files.

``sim.strategies.tiered`` charges each memory-tier copy the state's bytes at
``tier_copy_gbps``. Measured here with the tier's own code: ``layercheck.tiers.slots.Slot``
copies every state tensor (weights, Adam moments, steps) into its memory-mapped file
under a tmpfs folder (``/dev/shm`` where it is writable, as ``TierConfig``'s default;
else the scratch folder), the first copy untimed (it allocates the file's pages). The
two failure shares (``tier_process_share``, ``tier_buddy_loss_share``) are a fleet's,
not one machine's: their declared defaults, said so in their method.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from layercheck.contract.calibration import Figure
from layercheck.tiers.slots import Slot

from ..state import TrainingState
from .base import Bench, Mechanism, rate_figure, timed

__all__ = ["MemoryTierCopy", "tier_folder"]


def tier_folder(bench: Bench) -> Path:
    """A fresh folder on tmpfs where the machine has one writable, else in the scratch."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="layercheck-profiler-tier-", dir=shm))
    return bench.scratch("tier")


class MemoryTierCopy(Mechanism):
    """tiered: the state copied into a memory-tier slot, as ``MemoryTier.write`` does."""

    name = "memory tier"
    stated = ("tier_process_share", "tier_buddy_loss_share")

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        tensors = TrainingState(job.model, job.optimizer, job.scheduler).tensors()
        folder = tier_folder(bench)
        slot = Slot(folder, 0)
        try:
            nbytes = slot.write("state", tensors)["nbytes"]  # first touch: the pages
            samples = [timed(lambda: slot.write("state", tensors))[0]
                       for _ in range(bench.repeats)]
        finally:
            slot.close()
            shutil.rmtree(folder, ignore_errors=True)
        out = {"tier_copy_gbps": rate_figure(nbytes, samples, (
            "layercheck.tiers.slots.Slot.write of every state tensor (weights, Adam "
            f"moments, steps) into its memory-mapped file under {folder.parent}, "
            f"{bench.where()}"))}
        out.update(self.stated_figures())
        return out
