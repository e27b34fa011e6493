"""The tiered strategy for real: the library itself with a memory tier (``TierConfig``).

What ``sim.strategies.Tiered`` models, run by ``layercheck.tiers``: every step the
library's durable policy decides which layers to write (as ``layerwise``), and every step
the memory tier copies the whole training state into two slots of files under the node's
folder (``tier``), which outlive the worker. ``load()`` is the library's ``restore()``:
each layer's freshest intact copy, the memory tier's where it holds one (the exact step,
nothing stale), else the durable composite.

One process has no buddy rank (``TierConfig.buddy`` needs ranks on two nodes): a node's
loss, and its buddy's copy, are the supervisor's to play (``profiler.failures.supervisor``).
The folder ``tier`` is the node's memory; this job's tier is its sub-folder named as the
job's checkpoint folder, removed once the job is done (a finished job's memory tier is
never read again).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from layercheck.tiers import TierConfig

from .base import Checkpointer, Resume
from .layerwise import LayerCheckpointer

__all__ = ["TieredCheckpointer"]

BUDGET_BYTES = 64 << 30
"""The tier's budget: the job's, not a limit under test (the folder's free space is still
checked by the library)."""


class TieredCheckpointer(LayerCheckpointer):

    def __init__(self, job: Any, folder: Path, *, interval: int = 1,
                 tier: str | None = None) -> None:
        """``tier``: the node's memory-tier folder (a tmpfs); this job's tier is
        ``tier/<folder's name>``."""
        Checkpointer.__init__(self, job, folder, interval=interval)
        if tier is None:
            raise ValueError("the tiered checkpointer needs the node's memory-tier folder: "
                             "tier=PATH (a tmpfs folder the supervisor owns)")
        self.tier = Path(tier) / self.folder.name
        config = TierConfig(folder=str(self.tier), budget_bytes=BUDGET_BYTES, buddy=False)
        self.lc = job.make_layercheck(self.folder,
                                      job.config.layercheck_config(keep_versions=1),
                                      tiers=config)

    def load(self) -> Resume | None:
        step = self.lc.restore()
        if step == 0:
            return None
        taken = self.lc.tiers.last
        sources = {name: int(source) for name, (_, source) in taken.sources.items()}
        return Resume(step, int((self.lc.extra or {}).get("position", 0)), sources)

    def tiers_taken(self) -> dict[str, int]:
        """How many layers the last ``load`` took from each tier (memory, storage)."""
        taken = self.lc.tiers.last
        return taken.tiers() if taken is not None else {}

    def close(self) -> None:
        try:
            super().close()
        finally:
            shutil.rmtree(self.tier, ignore_errors=True)
