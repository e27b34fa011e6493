"""Automatic retention: which committed versions to drop once newer ones commit.

With ``keep_versions=k`` every layer keeps its k newest versions plus its
base-checkpoint version; an older version is dropped once k newer ones of
its layer are part of a recoverable step. Steps older than the newest step a
dropped version served stop being recoverable, so their training states are
dropped too: the recoverable steps stay one contiguous, newest range, and
each of them restores exactly what ``plan`` would have given before.

Nothing is retired until a newer training state has committed: layer
versions newer than the newest committed state (their state held back by a
failed write under ``on_error="warn"``, or not yet written) do not count
towards k. So the newest recoverable step, and every version it uses, stays
whatever fails afterwards. Torch-free.

The caller commits a ``drop`` record for each returned version before
deleting its file, so a crash in between leaves only unreferenced files
(``gc`` removes them). The returned list holds the states first: a reader
that sees only part of that append never sees a live state whose layer
version is already dropped.
"""
from __future__ import annotations

from .format import Version
from .manifest import ManifestView
from .policy import Reason

__all__ = ["Retention"]


class Retention:
    """Tracks the live versions of one timeline and decides what to drop."""

    def __init__(self, keep: int, view: ManifestView) -> None:
        if keep < 1:
            raise ValueError(f"keep_versions={keep}: keep at least the newest version (1)")
        self.keep = keep
        self._layers = {name: [v for v in versions if v.reason != Reason.BASE.label]
                        for name, versions in view.versions.items()}
        self._states = sorted(view.states.values(), key=lambda v: v.step)

    def committed(self, versions: list[Version]) -> list[Version]:
        """Note newly committed versions (layers and states); return those to drop now."""
        for version in versions:
            if version.layer is None:
                self._states.append(version)
            elif version.reason != Reason.BASE.label:
                self._layers.setdefault(version.layer, []).append(version)
        if not self._states:
            return []
        newest = self._states[-1].step
        layers, floor = [], 0  # steps below floor lost a version their composite used
        for live in self._layers.values():
            usable = sum(v.step <= newest for v in live)
            while usable > self.keep:
                layers.append(live.pop(0))
                usable -= 1
                floor = max(floor, live[0].step)
        states = []
        while self._states[0].step < floor:
            states.append(self._states.pop(0))
        return states + layers
