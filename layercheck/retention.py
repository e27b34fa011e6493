"""Automatic retention: which committed versions to drop once newer ones commit.

With ``keep_versions=k`` every layer keeps its k newest versions plus its
base-checkpoint version; an older version is dropped as soon as a newer one
of its layer commits. Steps older than the newest step a dropped version
served stop being recoverable, so their training states are dropped too:
the recoverable steps stay one contiguous, newest range, and each of them
restores exactly what ``plan`` would have given before. Torch-free.

The caller commits a ``drop`` record for each returned version before
deleting its file, so a crash in between leaves only unreferenced files
(``gc`` removes them).
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
        self._floor = 0  # steps below this lost a version their composite used

    def committed(self, versions: list[Version]) -> list[Version]:
        """Note newly committed versions (layers and states); return those to drop now."""
        drop = []
        for version in versions:
            if version.layer is None:
                self._states.append(version)
            elif version.reason != Reason.BASE.label:
                live = self._layers.setdefault(version.layer, [])
                live.append(version)
                while len(live) > self.keep:
                    drop.append(live.pop(0))
                    self._floor = max(self._floor, live[0].step)
        while self._states and self._states[0].step < self._floor:
            drop.append(self._states.pop(0))
        return drop
