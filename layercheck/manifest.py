"""The manifest: an append-only log of JSON records, the commit marker of everything.

A layer version or a step's training state exists only once its record is in
the manifest; files without a record are leftovers. Each line carries a CRC of
its own content, so a torn or garbled line is detected and skipped (with a
problem reported), never half-trusted. Torch-free.

Records (``kind``):
- ``header``: the model's layers and the config, written once when the
  directory is created.
- ``layer``: one version of one layer (step, file, bytes, checksum).
- ``state``: the small training state of a step (step, file, bytes,
  checksum); appended after the step's layer records, it makes the step
  recoverable.
- ``resume``: training was restored to ``step``: everything recorded earlier
  with a larger step belongs to an abandoned timeline and is ignored.
- ``drop``: the version committed as ``file`` is retired (automatic
  retention, ``keep_versions``); its file is deleted after this record.

Sharded checkpoints (DeepSpeed ZeRO: every rank writes its own shard of a
version) record ``shards`` instead of ``file``/``bytes``/``checksum``: one
entry per rank, all in one line, so a version and a step commit on every
rank at once or on none. A rank's view (``read_manifest(store, rank=r)``)
sees each version as its own shard; ``drop`` names a sharded version by its
rank-0 file.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import CorruptVersion
from .store import Store, check_relative

__all__ = ["MANIFEST", "FORMAT", "Shard", "Version", "ManifestView", "encode_record", "read_manifest",
           "seal_torn_tail", "read_verified", "check_structure", "checksum", "layer_path", "state_path"]

MANIFEST = "manifest.jsonl"
FORMAT = "layercheck/1"


def checksum(data: bytes | memoryview) -> str:
    """The checksum stored in records: CRC-32 (zlib), as 'crc32:<8 hex>'.

    CRC-32 catches every burst error up to 32 bits and any other corruption
    with probability 1 - 2^-32, at about twice the speed of SHA-256 here, so
    verification stays cheaper than the disk read it follows."""
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def layer_path(layer: str, step: int, rank: int | None = None) -> str:
    return f"layers/{_safe(layer)}@{step:09d}{_rank_suffix(rank)}.safetensors"


def state_path(step: int, rank: int | None = None) -> str:
    return f"states/{step:09d}{_rank_suffix(rank)}.safetensors"


def _rank_suffix(rank: int | None) -> str:
    return "" if rank is None else f".rank{rank:05d}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name) or "_"


def encode_record(record: dict[str, Any]) -> bytes:
    """One manifest line: the record's JSON with a CRC of that JSON appended."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    crc = zlib.crc32(body.encode()) & 0xFFFFFFFF
    return f'{{"crc":"{crc:08x}","r":{body}}}\n'.encode()


def _decode_line(line: bytes) -> dict[str, Any]:
    outer = json.loads(line)
    body = json.dumps(outer["r"], sort_keys=True, separators=(",", ":"))
    if f"{zlib.crc32(body.encode()) & 0xFFFFFFFF:08x}" != outer["crc"]:
        raise ValueError("record CRC mismatch")
    record = outer["r"]
    if not isinstance(record, dict) or "kind" not in record:
        raise ValueError("record without kind")
    return record


@dataclass(frozen=True)
class Shard:
    """One rank's file of a sharded version."""

    file: str
    bytes: int
    checksum: str

    @classmethod
    def from_record(cls, record: Any) -> "Shard":
        if not isinstance(record, dict):
            raise ValueError("a shard must be an object {file, bytes, checksum}")
        if not isinstance(record.get("file"), str) or not isinstance(record.get("checksum"), str):
            raise ValueError("shard file and checksum must be strings")
        return cls(check_relative(record["file"]), _count(record, "bytes"), record["checksum"])

    def to_record(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes, "checksum": self.checksum}


@dataclass(frozen=True)
class Version:
    """A committed file: a layer version (``layer`` set) or a step's state (``layer`` None).

    For a sharded version ``file``/``bytes``/``checksum`` are the shard of
    the rank the manifest was read for, and ``shards`` lists every rank's."""

    step: int
    file: str
    bytes: int
    checksum: str
    layer: str | None = None
    reason: str | None = None
    shards: tuple[Shard, ...] = ()

    @classmethod
    def from_record(cls, record: dict[str, Any], rank: int | None = None) -> "Version":
        """The version a record describes (as ``rank`` sees it, for a sharded
        record; rank 0 when None); ValueError naming the field if malformed."""
        layer = record.get("layer")
        if record["kind"] == "layer" and not isinstance(layer, str):
            raise ValueError(f"layer record with layer={layer!r}: a name is required")
        shards: tuple[Shard, ...] = ()
        if "shards" in record:
            if not isinstance(record["shards"], list) or not record["shards"]:
                raise ValueError("shards must be a non-empty list")
            shards = tuple(Shard.from_record(s) for s in record["shards"])
            if (rank or 0) >= len(shards):
                raise ValueError(f"a version with {len(shards)} shards read as rank {rank}: "
                                 "restore with the world size the checkpoint was written with")
            own = shards[rank or 0]
        else:
            own = Shard.from_record(record)
        return cls(step=_count(record, "step"), file=own.file, bytes=own.bytes,
                   checksum=own.checksum, layer=layer, reason=record.get("reason"),
                   shards=shards)

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

    def to_record(self) -> dict[str, Any]:
        kind = "state" if self.layer is None else "layer"
        record: dict[str, Any] = {"kind": kind, "step": self.step}
        if self.shards:
            record["shards"] = [s.to_record() for s in self.shards]
        else:
            record.update(file=self.file, bytes=self.bytes, checksum=self.checksum)
        if self.layer is not None:
            record["layer"] = self.layer
            record["reason"] = self.reason
        return record


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
            self._truncate(_count(record, "step"))
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


def _count(record: dict[str, Any], key: str) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{record['kind']} record with {key}={value!r}: an integer >= 0 is "
                         "required")
    return value


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
            view.apply(_decode_line(line))
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


def check_structure(data: bytes, what: str) -> None:
    """CorruptVersion unless ``data`` is laid out as a safetensors file: a JSON
    header whose tensors tile the data section exactly. Cheap: no tensor is built."""
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
    except Exception as exc:  # every way a header can be malformed means 'corrupt'
        raise CorruptVersion(f"{what}: not a valid safetensors file ({exc})") from None
