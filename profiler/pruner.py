"""Keep a profiling run's checkpoint directory small: delete superseded layer versions.

A profile writes the same layers hundreds of times; keeping every version
would take tens of GB for MiniLM. Recovery of the newest committed step
(what a drill does) reads only the newest committed version of each layer,
so once a newer version of a layer is committed the older file is deleted.
Its manifest record stays: ``python -m layercheck inspect`` will report the
file missing, and recovering an *older* step is no longer possible. Only the
profiler's scratch directories are pruned; ``--keep-history`` turns it off.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from layercheck.manifest import layer_path

__all__ = ["Pruner"]


class Pruner:
    """Deletes a layer's previous version file once a newer one is committed."""

    def __init__(self, directory: Path, *, enabled: bool = True) -> None:
        self.directory = Path(directory)
        self.enabled = enabled
        self._newest: dict[str, int] = {}
        self.freed_bytes = 0

    def committed(self, records: Iterable[object]) -> None:
        """Feed committed ``WriteRecord``s (drained from LayerCheck)."""
        for record in records:
            name, step = record.name, record.step  # type: ignore[attr-defined]
            previous = self._newest.get(name)
            if previous is not None and previous >= step:
                continue  # an older timeline's record: nothing newer to keep
            self._newest[name] = step
            if previous is not None and self.enabled:
                self._delete(layer_path(name, previous))

    def _delete(self, relative: str) -> None:
        path = self.directory / relative
        try:
            self.freed_bytes += path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            pass
