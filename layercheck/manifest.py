"""The manifest replayed: what is committed and live, and reading a committed file.

A layer version or a step's training state exists only once its record is in
the manifest (``manifest.jsonl``; records in ``layercheck.format``); files
without a record are leftovers. Each line carries a CRC of its own content,
so a torn or garbled line is detected and skipped (with a problem reported),
never half-trusted. A ``resume`` record abandons every later step of the
timeline before it; a ``drop`` record retires a version. A rank's view of a
sharded checkpoint (``read_manifest(store, rank=r)``) sees each version as
its own shard. Torch-free.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import CorruptVersion
from .format import MANIFEST, Version, checksum, count, decode_line
from .store import Store, check_relative

__all__ = ["ManifestView", "read_manifest", "seal_torn_tail", "read_verified", "check_structure"]


@dataclass
class ManifestView:
    """The manifest replayed: what is committed and live now."""

    header: dict[str, Any] | None = None
    versions: dict[str, list[Version]] = field(default_factory=dict)
    """Per layer name, its live versions in ascending step order."""
    states: dict[int, Version] = field(default_factory=dict)
    """Per step, its committed training state."""
    problems: list[str] = field(default_factory=list)
    """Lines that were skipped, each with the reason (torn, bad CRC, bad path)."""
    resumes: list[int] = field(default_factory=list)
    rank: int | None = None
    """The rank whose shards ``versions`` and ``states`` show (sharded checkpoints)."""

    @property
    def world_size(self) -> int:
        """Ranks that write shards (1 for an unsharded checkpoint)."""
        return int((self.header or {}).get("world_size", 1))

    @property
    def layer_names(self) -> list[str]:
        return [layer["name"] for layer in (self.header or {}).get("layers", [])]

    def latest_step(self) -> int | None:
        return max(self.states) if self.states else None

    def all_versions(self) -> Iterable[Version]:
        for versions in self.versions.values():
            yield from versions
        yield from self.states.values()

    def apply(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        if kind == "header":
            if self.header is None:
                self.header = _check_header(record)
        elif kind == "layer":
            version = Version.from_record(record, self.rank)
            self.versions.setdefault(version.layer, []).append(version)
        elif kind == "state":
            version = Version.from_record(record, self.rank)
            self.states[version.step] = version
        elif kind == "resume":
            self._truncate(count(record, "step"))
        elif kind == "drop":
            self._drop(check_relative(record["file"]))
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def _drop(self, key: str) -> None:
        for name, versions in self.versions.items():
            self.versions[name] = [v for v in versions if v.key != key]
        self.states = {s: v for s, v in self.states.items() if v.key != key}

    def _truncate(self, step: int) -> None:
        self.resumes.append(step)
        for name, versions in self.versions.items():
            self.versions[name] = [v for v in versions if v.step <= step]
        self.states = {s: v for s, v in self.states.items() if s <= step}


def _check_header(record: dict[str, Any]) -> dict[str, Any]:
    """The header, if its layer table has the shape every reader relies on."""
    layers = record.get("layers")
    if not isinstance(layers, list) or not all(
            isinstance(l, dict) and isinstance(l.get("name"), str)
            and isinstance(l.get("kind"), str) and isinstance(l.get("params"), int)
            for l in layers):
        raise ValueError("malformed header: 'layers' must be a list of {name, kind, params}")
    return record


def read_manifest(store: Store, rank: int | None = None) -> ManifestView:
    """Replay the store's manifest (as ``rank`` sees a sharded one). Damaged
    lines are skipped and listed in ``problems``; an absent manifest gives an
    empty view (no header)."""
    view = ManifestView(rank=rank)
    if not store.exists(MANIFEST):
        return view
    data = store.read(MANIFEST)
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)  # a final line without newline: torn append
        try:
            if last:
                raise ValueError("torn append: the last line has no newline")
            view.apply(decode_line(line))
        except Exception as exc:  # any damage to one line: skip it, say why
            view.problems.append(f"{MANIFEST} line {number}: skipped ({exc})")
    return view


def seal_torn_tail(store: Store) -> bool:
    """End a torn last line (a crash mid-append) with a newline; True if there was one.

    Call with the directory locked, before the first append: otherwise the next
    record would be glued to the torn bytes and be skipped with them, and a lost
    ``resume`` record would mix an abandoned timeline into later restores. The
    torn line itself stays, reported in ``problems`` as a damaged line."""
    if not store.exists(MANIFEST):
        return False
    data = store.read(MANIFEST)
    if not data or data.endswith(b"\n"):
        return False
    store.append(MANIFEST, b"\n")
    return True


def read_verified(store: Store, version: Version) -> bytes:
    """The file's bytes, or CorruptVersion if missing, short, failing its checksum
    or not structured as a safetensors file (the manifest's checksum proves only
    that the file is what was recorded, not that what was recorded is sane)."""
    try:
        data = store.read(version.file)
    except (FileNotFoundError, OSError) as exc:
        raise CorruptVersion(f"{version.file}: cannot be read ({exc.__class__.__name__})") from None
    if len(data) != version.bytes:
        raise CorruptVersion(f"{version.file}: {len(data)} bytes on disk, {version.bytes} committed")
    if checksum(data) != version.checksum:
        raise CorruptVersion(f"{version.file}: checksum mismatch (the file changed after commit)")
    check_structure(data, version.file)
    return data


def check_structure(data: bytes, what: str) -> dict[str, str]:
    """The metadata of the safetensors file ``data``; CorruptVersion unless it is
    laid out as one: a JSON header whose tensors tile the data section exactly.
    Cheap: no tensor is built."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        if n > len(data) - 8:
            raise ValueError(f"header of {n} bytes in a file of {len(data)}")
        header = json.loads(data[8:8 + n])
        spans = sorted(tuple(entry["data_offsets"]) for key, entry in header.items()
                       if key != "__metadata__")
        end = 0
        for start, stop in spans:
            if start != end or stop < start:
                raise ValueError("tensor data offsets do not tile the data section")
            end = stop
        if end != len(data) - 8 - n:
            raise ValueError(f"tensors cover {end} of {len(data) - 8 - n} data bytes")
        return header.get("__metadata__") or {}
    except Exception as exc:  # every way a header can be malformed means 'corrupt'
        raise CorruptVersion(f"{what}: not a valid safetensors file ({exc})") from None
