"""Garbage collection: delete superseded versions, never one a kept step needs.

Crash-safe by order: the new manifest (only live records) replaces the old one
atomically first; files are deleted after. A crash in between leaves
unreferenced files, which the next run removes.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import CheckpointNotFound
from .format import MANIFEST, Version, encode_record
from .manifest import read_manifest
from .policy import Reason
from .recovery import make_plan
from .store import Store

__all__ = ["collect_garbage", "GcReport"]


@dataclass(frozen=True)
class GcReport:
    kept_steps: list[int]
    kept_files: int
    removed_files: list[str]
    freed_bytes: int


def collect_garbage(store: Store, *, keep: int = 1, dry_run: bool = False) -> GcReport:
    """Keep the ``keep`` newest recoverable steps (each layer's version its plan
    uses, verified now) and the base checkpoint; delete everything else."""
    if keep < 1:
        raise ValueError(f"keep={keep}: keep at least the newest recoverable step (1)")
    store.lock()
    try:
        return _collect(store, keep, dry_run)
    finally:
        store.unlock()


def _collect(store: Store, keep: int, dry_run: bool) -> GcReport:
    view = read_manifest(store)
    if view.header is None:
        raise CheckpointNotFound(f"{store.url}: not a layercheck checkpoint")
    steps = sorted(view.states)[-keep:]
    live: dict[str, Version] = {}
    for step in steps:
        plan = make_plan(store, view, step)
        live[plan.state.key] = plan.state
        live.update({v.key: v for v in plan.sources.values()})
    bases = [v for vs in view.versions.values() for v in vs if v.reason == Reason.BASE.label]
    base_step = min((v.step for v in bases), default=None)
    live.update({v.key: v for v in bases if v.step == base_step})
    ordered = sorted(live.values(), key=lambda v: (v.step, v.layer is None, v.layer or ""))
    kept = {f for v in live.values() for f in v.files}
    doomed = [f for f in store.list("layers") + store.list("states") if f not in kept]
    freed = sum(store.size(f) for f in doomed)
    if not dry_run:
        manifest = encode_record(view.header) + b"".join(encode_record(v.to_record())
                                                         for v in ordered)
        store.write_atomic(MANIFEST, manifest)
        for path in doomed:
            store.delete(path)
    return GcReport(kept_steps=steps, kept_files=len(live), removed_files=doomed,
                    freed_bytes=freed)
