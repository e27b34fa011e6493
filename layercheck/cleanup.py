"""Garbage collection: delete superseded versions, never one a kept step needs.

Crash-safe by order: the new manifest (only live records) replaces the old one
atomically first; files are deleted after. A crash in between leaves
unreferenced files, which the next run removes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import CheckpointNotFound
from .manifest import MANIFEST, ManifestView, Version, encode_record, read_manifest
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
    # a sharded checkpoint is planned as every rank sees it: each rank verifies
    # (and may fall back past) its own shards
    for rank in range(view.world_size) if view.world_size > 1 else [None]:
        ranked = read_manifest(store, rank) if rank is not None else view
        for step in steps:
            plan = make_plan(store, ranked, step, verify=True)
            live[plan.state.key] = plan.state
            live.update({v.key: v for v in plan.sources.values()})
    base_step = min((v.step for vs in view.versions.values() for v in vs if v.reason == "base"),
                    default=None)
    for versions in view.versions.values():
        live.update({v.key: v for v in versions if v.reason == "base" and v.step == base_step})
    live = {key: _as_listed(view, v) for key, v in live.items()}
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


def _as_listed(view: ManifestView, version: Version) -> Version:
    """The version as rank 0 sees it (the form its record is rewritten in)."""
    if not version.shards:
        return version
    first = version.shards[0]
    return replace(version, file=first.file, bytes=first.bytes, checksum=first.checksum)
