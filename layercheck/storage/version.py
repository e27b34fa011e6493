"""A committed version as the manifest records it: a file, or one shard per rank. Torch-free.

``Version`` is what ``format``'s ``layer`` and ``state`` records describe,
``Shard`` one rank's file of a sharded one; ``format`` re-exports both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Shard", "Version"]


@dataclass(frozen=True)
class Shard:
    """One rank's file of a sharded version."""

    file: str
    bytes: int
    checksum: str

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Shard":
        """The shard of a record that passed ``check_record``."""
        return cls(record["file"], record["bytes"], record["checksum"])

    def to_record(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes, "checksum": self.checksum}


@dataclass(frozen=True)
class Version:
    """A committed file: a layer version (``layer`` set) or a step's state (``layer`` None).

    For a sharded version ``file``/``bytes``/``checksum`` are the shard of
    the rank the manifest was read for (rank 0's where the version's layout has
    no such rank: written at a smaller world size), and ``shards`` lists every
    rank's."""

    step: int
    file: str
    bytes: int
    checksum: str
    layer: str | None = None
    reason: str | None = None
    shards: tuple[Shard, ...] = ()
    rank: int | None = None
    """The rank whose shard ``file`` is (None: unsharded); not recorded, it is the
    shard's place in ``shards``."""
    frozen: tuple[str, ...] = ()
    """The layer's parameters that did not train at ``step`` (see the module doc)."""
    base: int | None = None
    """A partial version's full version (its step), which holds ``frozen``; None: full."""
    refs: tuple[tuple[str, str, str, str], ...] = ()
    """A full version's frozen parameters held by a pretrained file instead of its own:
    (parameter, file, tensor key, checksum) each (see the module doc)."""
    layout: int = 0
    """The id of the layout it was written in (``format``: layouts; 0: the header's)."""

    @property
    def holds_frozen(self) -> bool:
        """A full version with frozen parameters: partial versions may name it as their
        base, so retention and gc keep it as they keep the base checkpoint's."""
        return bool(self.frozen) and self.base is None

    @classmethod
    def from_record(cls, record: dict[str, Any], rank: int | None = None) -> "Version":
        """The version a layer or state record (one that passed ``check_record``)
        describes, as ``rank`` sees it (for a sharded record; rank 0 when None, or
        where the record has no shard of ``rank``: a version written at a smaller
        world size, read as rank 0's, which a state of it is at a larger one)."""
        shards = tuple(Shard.from_record(s) for s in record.get("shards", ()))
        rank = rank if shards and rank is not None and rank < len(shards) else 0
        own = shards[rank] if shards else Shard.from_record(record)
        layer = record["layer"] if record["kind"] == "layer" else None
        base = record.get("base") if layer is not None else None
        if base is not None and base >= record["step"]:
            raise ValueError(f"layer record of step {record['step']} names base {base}: a "
                             "partial version's full version comes before it")
        refs = tuple(sorted((name, r["file"], r["key"], r["checksum"])
                            for name, r in (record.get("refs") or {}).items()))
        if refs and (base is not None or not {r[0] for r in refs} <= set(record.get("frozen", ()))):
            raise ValueError(f"layer record of step {record['step']}: refs name parameters "
                             "that are not its frozen ones, or it is a partial version")
        return cls(step=record["step"], file=own.file, bytes=own.bytes, checksum=own.checksum,
                   layer=layer, reason=record.get("reason") if layer is not None else None,
                   shards=shards, rank=rank if shards else None, layout=record.get("layout", 0),
                   frozen=tuple(record.get("frozen", ())) if layer is not None else (),
                   base=base, refs=refs if layer is not None else ())

    @property
    def key(self) -> str:
        """The name a ``drop`` record uses: the file, or rank 0's file if sharded."""
        return self.shards[0].file if self.shards else self.file

    @property
    def files(self) -> list[str]:
        """Every file of the version (all ranks' shards)."""
        return [s.file for s in self.shards] if self.shards else [self.file]

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards) if self.shards else self.bytes

    def per_rank(self) -> list["Version"]:
        """Every rank's file as a version of its own (just this one if unsharded)."""
        return [Version(self.step, s.file, s.bytes, s.checksum, self.layer, self.reason, rank=r,
                        frozen=self.frozen, base=self.base, refs=self.refs, layout=self.layout)
                for r, s in enumerate(self.shards)] if self.shards else [self]

    def to_record(self) -> dict[str, Any]:
        kind = "state" if self.layer is None else "layer"
        record: dict[str, Any] = {"kind": kind, "step": self.step}
        if self.shards:
            record["shards"] = [s.to_record() for s in self.shards]
        else:
            record.update(file=self.file, bytes=self.bytes, checksum=self.checksum)
        if self.layout:  # absent for layout 0: records as before layouts
            record["layout"] = self.layout
        if self.layer is not None:
            record["layer"] = self.layer
            record["reason"] = self.reason
            if self.frozen:  # absent where nothing is frozen: records as before frozen tensors
                record["frozen"] = list(self.frozen)
            if self.base is not None:
                record["base"] = self.base
            if self.refs:
                record["refs"] = {name: {"file": file, "key": key, "checksum": digest}
                                  for name, file, key, digest in self.refs}
        return record
