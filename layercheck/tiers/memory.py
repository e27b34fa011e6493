"""The memory tier of one rank: every step's layers and training state, in two slots.

Contract (``write`` once per step, from the training thread):
- The slot written is never the one holding the newest committed step, and
  ``write`` first waits until the step before it is committed (backpressure):
  a crash at any moment leaves at least the previous step intact.
- The training thread copies the bytes (the stall); the checksums, the
  marker and ``after_commit`` (the buddy send) run on a thread of the tier's
  own, while training goes on. An error there is raised by the next ``write``
  or by ``flush``.
- The host memory taken is two slots of this rank's bytes (plus what the
  buddy keeps for its ward, ``layercheck.tiers.buddy``), checked against the
  budget before the first byte is written: a job that does not fit is refused,
  never left to run out of memory.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping

import torch

from ..contract.errors import LayerCheckError
from .slots import Slot, layout

__all__ = ["MemoryTier", "TierFull", "slot_bytes"]


class TierFull(LayerCheckError):
    """The memory tier does not fit its budget or its folder; the message says the fix."""


def slot_bytes(items: Mapping[str, Mapping[str, torch.Tensor]]) -> int:
    """The bytes one slot of ``items`` takes (each tensor aligned)."""
    return sum(layout(tensors)[1] for tensors in items.values())


class MemoryTier:
    """Rank ``rank``'s slots under ``folder/rank<rank>/`` (see the module doc)."""

    def __init__(self, folder: str, rank: int, budget_bytes: int) -> None:
        self.folder = os.path.join(folder, f"rank{rank}")
        self.rank, self.budget_bytes = rank, budget_bytes
        self.slots = [Slot(self.folder, 0), Slot(self.folder, 1)]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="layercheck-memtier")
        self._pending: Future | None = None
        self.checked = False
        """Whether the budget was checked (at the first write: the sizes are known then)."""

    def newest(self) -> tuple[Slot | None, dict[str, Any] | None]:
        """(the slot holding the newest committed step, its marker), or (None, None)."""
        marked = [(s, m) for s in self.slots if (m := s.marker()) is not None]
        if not marked:
            return None, None
        return max(marked, key=lambda sm: sm[1]["step"])

    def check_budget(self, own: int, ward: int) -> None:
        """TierFull unless two slots of ``own`` bytes and two of ``ward`` fit the budget
        and the folder's free space."""
        need = 2 * (own + ward)
        if need > self.budget_bytes:
            raise TierFull(
                f"the memory tier needs {need / 2**20:.1f} MiB on rank {self.rank} (two slots of "
                f"its {own / 2**20:.1f} MiB" + (f" and of its ward's {ward / 2**20:.1f} MiB"
                                                 if ward else "") +
                f"), over its budget of {self.budget_bytes / 2**20:.1f} MiB: raise "
                "TierConfig(budget_bytes=...), shard the model over more ranks, or leave "
                "tiers out")
        os.makedirs(self.folder, exist_ok=True)
        stat = os.statvfs(self.folder)
        held = sum(f.stat().st_size for s in self.slots if s.path.exists()
                   for f in s.path.iterdir())
        free = stat.f_bavail * stat.f_frsize + held
        if need > free:
            raise TierFull(
                f"the memory tier needs {need / 2**20:.1f} MiB on rank {self.rank} but "
                f"{os.path.dirname(self.folder)} has {free / 2**20:.1f} MiB free: give a larger "
                "tmpfs (docker run --shm-size, a hostPath tmpfs) or another TierConfig(folder=...)")

    def write(self, step: int, items: Mapping[str, Mapping[str, torch.Tensor]],
              document: Mapping[str, str],
              after_commit: Callable[[Slot, dict[str, Any]], None] | None = None) -> None:
        """Copy step ``step``'s ``items`` (name -> tensors: ``L<i>`` per layer, ``state``)
        and the training state's ``document`` into the slot that does not hold the
        newest committed step; commit it (and call ``after_commit``) off the thread."""
        self.wait()
        slot_now, _ = self.newest()
        slot = self.slots[1 - slot_now.k] if slot_now is not None else self.slots[0]
        slot.invalidate()
        entries = {name: slot.write(name, tensors) for name, tensors in items.items()}
        record = {"step": step, "rank": self.rank, "items": entries, "document": dict(document)}
        self._pending = self._pool.submit(self._commit, slot, record, after_commit)

    def _commit(self, slot: Slot, record: dict[str, Any],
                after_commit: Callable[[Slot, dict[str, Any]], None] | None) -> None:
        for name, item in record["items"].items():
            slot.checksum(name, item)
        slot.commit(record)
        if after_commit is not None:
            after_commit(slot, record)

    def wait(self) -> None:
        """Until the last write is committed; its error, if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def drop_after(self, step: int) -> None:
        """Take away every slot of a step after ``step`` (a timeline a restore abandoned)."""
        self.wait()
        for slot in self.slots:
            marker = slot.marker()
            if marker is not None and marker["step"] > step:
                slot.invalidate()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            for slot in self.slots:
                slot.close()
