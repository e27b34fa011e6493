"""Automatic retention: which committed versions to drop once newer ones commit.

With ``keep_versions=k`` every layer keeps its k newest versions plus its
base-checkpoint version (and any full version holding frozen parameters, which
partial versions read: ``format``, frozen tensors); an older version is dropped once k newer ones of
its layer are part of a recoverable step. Steps older than the newest step a
dropped version served stop being recoverable, so their training states are
dropped too: the recoverable steps stay one contiguous, newest range, and
each of them restores exactly what ``plan`` would have given before.

A kept version is one a restore can use. Where a restore opened the timeline,
each layer's versions newer than the one it applied (``standing``: its plan's
sources), at or before the restored step, are versions the plan passed over as
damaged (on some rank): they are neither counted towards k nor dropped (like
``gc``, retention deletes nothing that failed verification; it stays, file and
record, for ``inspect`` to report). So the version a restore stands on goes
only once k newer versions of its layer are part of a recoverable step, and
then with every step that could have used it. Older versions that restore
never read count as before: they are dropped before it, so counting them can
never cost it. A file damaged after this process wrote or verified it is not
known here (nothing is read again).

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

from typing import Mapping

from .format import Version
from .manifest import ManifestView
from ..contract.policy import Reason

__all__ = ["Retention"]


class Retention:
    """Tracks the live versions of one timeline and decides what to drop."""

    def __init__(self, keep: int, view: ManifestView,
                 standing: Mapping[str, Version] | None = None) -> None:
        """``view``: the timeline's live versions; ``standing``: per layer, the version
        the restore that opened it applied (see the module doc), none without a restore."""
        if keep < 1:
            raise ValueError(f"keep_versions={keep}: keep at least the newest version (1)")
        self.keep = keep
        standing = standing or {}
        self._layers = {name: [v for v in versions if not _always_kept(v)
                               and (name not in standing or v.step <= standing[name].step)]
                        for name, versions in view.versions.items()}
        self._states = sorted(view.states.values(), key=lambda v: v.step)

    def committed(self, versions: list[Version]) -> list[Version]:
        """Note newly committed versions (layers and states); return those to drop now."""
        for version in versions:
            if version.layer is None:
                self._states.append(version)
            elif not _always_kept(version):
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


def _always_kept(version: Version) -> bool:
    """The base checkpoint's version, and a full version holding frozen parameters that
    partial versions may read (``format``: frozen tensors): never counted, never dropped."""
    return version.reason == Reason.BASE.label or version.holds_frozen
