"""Garbage collection: delete superseded versions, never one a kept step needs.

Crash-safe by order: the new manifest (only live records) replaces the old one
atomically first; files are deleted after. A crash in between leaves
unreferenced files, which the next run removes, as it removes the temp files of
writes a crash cut short (a manifest compaction killed before its rename leaves
``.manifest.jsonl.<hex>.tmp``): only names of ``write_atomic``'s own pattern, and
only under the lock, so never a live writer's write in flight.

It deletes only files the format names (``format.deletable``: versions' files
and the temp files of writes), listed in the directory, never a path a record
gives: a file of someone else's (in ``layers/`` too), the manifest and the
``.lock`` stay. Nothing it could not verify is deleted: a version the plan
passes over as damaged stays (file and record), reported in ``skipped``; an I/O
error while verifying (``ReadFailed``: not damage) stops gc before it deletes
anything.
With no recoverable step there is nothing to keep a version for: gc refuses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..contract.errors import CheckpointNotFound, ReadFailed
from ..storage.format import MANIFEST, Version, deletable
from ..storage.manifest import encode_manifest, read_manifest
from ..contract.policy import Reason
from ..recovery import make_plan
from ..storage.store import Store, is_temporary

__all__ = ["collect_garbage", "GcReport"]


@dataclass(frozen=True)
class GcReport:
    kept_steps: list[int]
    kept_files: int
    removed_files: list[str]
    freed_bytes: int
    skipped: list[str] = field(default_factory=list)
    """Versions kept because they failed verification, each with the reason."""


def collect_garbage(store: Store, *, keep: int = 1, dry_run: bool = False) -> GcReport:
    """Keep the ``keep`` newest recoverable steps (each layer's version its plan
    uses, verified now) and the base checkpoint; delete everything else."""
    if keep < 1:
        raise ValueError(f"keep={keep}: keep at least the newest recoverable step (1)")
    store.lock()
    try:
        return _collect(store, keep, dry_run)
    except ReadFailed as exc:
        raise ReadFailed(f"{exc}; gc stopped and nothing was deleted") from None
    finally:
        store.unlock()


def _collect(store: Store, keep: int, dry_run: bool) -> GcReport:
    view = read_manifest(store)
    header = view.require_header(store.url)
    if not view.states:
        raise CheckpointNotFound(f"{store.url}: no recoverable step yet, so gc deletes nothing "
                                 "(see `python -m layercheck inspect`)")
    steps = sorted(view.states)[-keep:]
    # versions, not their files: a damaged record naming a kept version's file (another
    # step's, another layer's) must not displace that version's record
    live: set[Version] = set()
    skipped: dict[str, str] = {}
    for step in steps:
        plan = make_plan(store, view, step)
        live.add(plan.state)
        live.update(plan.sources.values())
        live.update(plan.bases.values())  # the full versions holding their frozen parameters
        live.update(plan.passed_over)  # damaged: kept, never deleted
        skipped.update(zip((v.key for v in plan.passed_over), plan.warnings))
    bases = [v for vs in view.versions.values() for v in vs if v.reason == Reason.BASE.label]
    base_step = min((v.step for v in bases), default=None)
    live.update(v for v in bases if v.step == base_step)
    kept = {f for v in live for f in v.files}
    # only what the format names (a version's file, a temp file of one, of the manifest
    # or a config), never a file of someone else's in layers/ or at the root
    doomed = [f for f in store.list("layers", temporary=True) + store.list("states", temporary=True)
              if f not in kept and deletable(f)]  # temp files too: no writer runs meanwhile
    # and what a compaction killed before its rename left: '.manifest.jsonl.<hex>.tmp'
    doomed += [f for f in store.list("", temporary=True) if is_temporary(f) and deletable(f)]
    freed = sum(store.size(f) for f in doomed)
    if not dry_run:
        store.write_atomic(MANIFEST, encode_manifest(header, live, view.layouts.values(),
                                                            view.lineage))
        for path in doomed:
            store.delete(path)
    return GcReport(kept_steps=steps, kept_files=len(live), removed_files=doomed,
                    freed_bytes=freed, skipped=list(skipped.values()))
