"""A memory-tier slot: one rank's copy of one step, as files under a tmpfs folder.

A slot is a folder ``slot<k>/`` holding one file per item (``L<i>``: layer i's
tensors; ``state``: the training state's tensors) and, beside it, its commit
marker ``slot<k>.json`` (the step, per item its tensors' layout, size and
checksum, the state's document). The marker is written last (a temporary file
renamed), and removed before the slot is written again: a slot counts only
when its marker is there, and every item is verified against the marker's
checksum when read. Items are raw bytes (each tensor at an offset aligned to
``ALIGN``), mapped into memory once and copied into in place, so that a step's
write is one copy of its bytes into memory that outlives the process.
"""
from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from ..storage.checksums import Checksummer, checksum_matches
from ..contract.errors import CorruptVersion
from ..storage.lineage import Lineage

__all__ = ["ALIGN", "Slot", "layout", "off_lineage", "tensors_from", "verified_bytes"]

ALIGN = 64
"""Each tensor of an item starts at a multiple of this many bytes (any dtype's views)."""


def layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[list[Any]], int]:
    """([key, dtype, shape, offset, nbytes] per tensor, the item's size)."""
    entries, offset = [], 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        entries.append([key, str(t.dtype).removeprefix("torch."), list(t.shape), offset, nbytes])
        offset += -(-nbytes // ALIGN) * ALIGN
    return entries, offset


def tensors_from(buffer: torch.Tensor, entries: list[list[Any]]) -> dict[str, torch.Tensor]:
    """The tensors of an item's bytes (a uint8 tensor), as views of it."""
    out = {}
    for key, dtype, shape, offset, nbytes in entries:
        flat = buffer[offset:offset + nbytes].view(getattr(torch, dtype))
        out[key] = flat.reshape(shape)
    return out


def verified_bytes(data: torch.Tensor, recorded: str, what: str) -> torch.Tensor:
    """``data`` (uint8) if its checksum is ``recorded``, else CorruptVersion."""
    if not checksum_matches(memoryview(data.numpy()), recorded):
        raise CorruptVersion(f"{what}: checksum mismatch (the memory-tier file is damaged)")
    return data


class Slot:
    """Slot ``k`` under ``folder`` (see the module doc). ``write`` and ``commit`` are
    the writer's; ``marker`` and ``read`` the reader's."""

    def __init__(self, folder: str | os.PathLike[str], k: int) -> None:
        self.root = Path(folder)
        self.k = k
        self.path = self.root / f"slot{k}"
        self.marker_path = self.root / f"slot{k}.json"
        self._maps: dict[str, tuple[int, mmap.mmap, np.ndarray]] = {}

    # -- reading -----------------------------------------------------------------
    def marker(self) -> dict[str, Any] | None:
        """The committed marker, or None (never committed, being written, unreadable)."""
        try:
            record = json.loads(self.marker_path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and "step" in record else None

    def read(self, name: str, item: Mapping[str, Any]) -> torch.Tensor:
        """Item ``name``'s bytes, read into memory of their own and verified against
        ``item`` (its marker entry): CorruptVersion if missing, short or damaged."""
        what = f"memory tier {self.path / name}"
        try:
            data = np.fromfile(self.path / name, dtype=np.uint8)
        except OSError as exc:
            raise CorruptVersion(f"{what}: unreadable ({exc})") from None
        if data.size != item["nbytes"]:
            raise CorruptVersion(f"{what}: {data.size} bytes, its marker says {item['nbytes']}")
        return verified_bytes(torch.from_numpy(data), item["checksum"], what)

    # -- writing -----------------------------------------------------------------
    def invalidate(self) -> None:
        """Take the marker away: from now on the slot counts as being written."""
        try:
            os.unlink(self.marker_path)
        except FileNotFoundError:
            pass

    def buffer(self, name: str, nbytes: int) -> torch.Tensor:
        """Item ``name``'s file of ``nbytes``, mapped: a uint8 tensor to write into."""
        held = self._maps.get(name)
        if held is not None and held[0] == nbytes and (self.path / name).exists():
            return torch.from_numpy(held[2])
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / name, "a+b") as f:
            os.ftruncate(f.fileno(), nbytes)
            mapped = mmap.mmap(f.fileno(), max(nbytes, 1))
        array = np.frombuffer(mapped, dtype=np.uint8, count=nbytes)
        self._maps[name] = (nbytes, mapped, array)
        return torch.from_numpy(array)

    def write(self, name: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Copy ``tensors`` into item ``name``; its marker entry, but the checksum
        (``checksum`` adds it, off the training thread)."""
        entries, nbytes = layout(tensors)
        buffer = self.buffer(name, nbytes)
        for (key, _, _, offset, size), t in zip(entries, tensors.values()):
            src = t.detach().reshape(-1)
            if not src.is_contiguous():
                src = src.contiguous()
            buffer[offset:offset + size].copy_(src.view(torch.uint8))
        return {"tensors": entries, "nbytes": nbytes}

    def checksum(self, name: str, item: dict[str, Any]) -> None:
        """Add the checksum of item ``name``'s bytes as written to its entry."""
        summer = Checksummer()
        summer.update(memoryview(self.buffer(name, item["nbytes"]).numpy()))
        item["checksum"] = summer.value

    def commit(self, record: Mapping[str, Any]) -> None:
        """Write the marker: the slot now counts, as ``record`` describes it."""
        tmp = self.root / f".slot{self.k}.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.marker_path)

    def close(self) -> None:
        for _, mapped, _ in self._maps.values():
            try:
                mapped.close()
            except BufferError:  # a tensor still views it: the mapping goes with it
                pass
        self._maps.clear()


def off_lineage(lineage: Lineage, marker: Mapping[str, Any]) -> str | None:
    """Why the slot committed with ``marker`` may not be restored: written in a timeline
    the directory's ``lineage`` no longer holds at its step (``storage.lineage``), in
    words that start with "abandoned"; None where it may."""
    return lineage.refusal(marker.get("document", {}).get("timeline"), int(marker["step"]))
