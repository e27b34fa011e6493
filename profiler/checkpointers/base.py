"""The contract every strategy's real checkpointer keeps, and what they share.

Contract: ``load()`` once, first (the newest recovery point into the live job,
or None: start the job at step 1); ``due(step, last)`` says whether ``save``
runs after that step; ``save(step, position)`` returns what the training
thread spent in it; ``held_s()``, after every training step, the seconds the
strategy held that step (CheckFreq's weight update waiting for its snapshot);
``close()`` releases the folder.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Checkpointer", "Resume", "Saved", "folder_bytes", "single_process"]


@dataclass(frozen=True)
class Resume:
    """Where a load left the job."""

    step: int
    position: int
    sources: dict[str, int] = field(default_factory=dict)
    """LayerCheck: the step of each layer's version in the composite."""


@dataclass(frozen=True)
class Saved:
    """What a save cost the training thread."""

    stall_s: float
    """Seconds the training thread spent on the save (waits included)."""
    tracking_s: float = 0.0
    """Seconds of the last optimizer phase that were the strategy's (LayerCheck's drift)."""
    bytes: int = 0
    """Bytes this save queued or wrote."""


class Checkpointer:
    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        self.job, self.folder, self.interval = job, Path(folder), interval
        self.folder.mkdir(parents=True, exist_ok=True)

    def due(self, step: int, last: int) -> bool:
        """Checkpoint after ``step`` of a ``last``-step job (never after the last:
        the end-of-job save is not part of the strategy)."""
        return step % self.interval == 0 and step < last

    def load(self) -> Resume | None:
        raise NotImplementedError

    def save(self, step: int, position: int) -> Saved:
        raise NotImplementedError

    def held_s(self) -> float:
        """Seconds of the training step just taken that waited for this strategy (read
        once per step, after it; they are inside that step's optimizer phase)."""
        return 0.0

    def flush(self) -> None:
        """Wait until every save so far is durable."""

    def close(self) -> None:
        pass


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@contextmanager
def single_process() -> Iterator[None]:
    """DCP warns that it saves in one process when asked to (no_dist=True): it is asked.
    The saves of CheckFreq and GEMINI run in threads of their own, so the filter is global."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
    yield
