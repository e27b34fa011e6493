"""LayerCheck's strategy for real: the library itself (``job.make_layercheck``).

A step is recoverable once its training state is committed; the policy decides, at
every step, which layers to write.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .base import Checkpointer, Resume, Saved

__all__ = ["LayerCheckpointer"]


class LayerCheckpointer(Checkpointer):

    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        super().__init__(job, folder, interval=interval)
        self.lc = job.make_layercheck(self.folder, job.config.layercheck_config(keep_versions=1))

    def due(self, step: int, last: int) -> bool:
        return step < last  # an opportunity at every step (the policy decides what to write)

    def load(self) -> Resume | None:
        step = self.lc.restore()
        if step == 0:
            return None
        plan = self.lc.restored.plan.to_dict()
        sources = {layer["layer"]: int(layer["source_step"]) for layer in plan["layers"]}
        return Resume(step, int((self.lc.extra or {}).get("position", 0)), sources)

    def save(self, step: int, position: int) -> Saved:
        # the drift hook ran inside the optimizer phase; the reduce of its sums runs here
        inside = self.lc.drift.hook_seconds()
        start = time.perf_counter()
        report = self.lc.step(extra={"position": position})
        spent = time.perf_counter() - start
        return Saved(spent + inside, tracking_s=inside, bytes=report.bytes_queued)

    def flush(self) -> None:
        self.lc.flush()

    def close(self) -> None:
        self.lc.close()
