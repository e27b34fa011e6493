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

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

import numpy as np

from .errors import CheckpointNotFound, CorruptVersion, LayerCheckError, NotARegularFile, ReadFailed
from .format import MANIFEST, Checksummer, Version, decode_line, described, encode_record
from .store import ReadBuffer, Store, read_buffer, read_into

__all__ = ["ManifestView", "read_manifest", "read_again", "read_consistent", "seal_torn_tail", "compact",
           "encode_manifest", "read_verified", "read_verified_file", "VerifiedFile",
           "check_structure", "parse_header", "DTYPE_SIZES"]

T = TypeVar("T")
R = TypeVar("R")


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
    skipped: list[bytes] = field(default_factory=list)
    """Those lines as they are in the manifest."""
    resumes: list[int] = field(default_factory=list)
    rank: int | None = None
    """The rank whose shards ``versions`` and ``states`` show (sharded checkpoints)."""
    source: bytes = field(default=b"", repr=False, compare=False)
    """The manifest's bytes this view replays (``read_again`` compares them)."""

    @property
    def world_size(self) -> int:
        """Ranks that write shards (1 for an unsharded checkpoint)."""
        return int((self.header or {}).get("world_size", 1))

    @property
    def layer_names(self) -> list[str]:
        return [layer["name"] for layer in (self.header or {}).get("layers", [])]

    def require_header(self, url: str) -> dict[str, Any]:
        """The header; CheckpointNotFound unless there is one, saying why where a
        damaged line may have been it (the first such line)."""
        if self.header is None:
            why = f": {self.problems[0]}" if self.problems else ""
            raise CheckpointNotFound(f"{url}: not a layercheck checkpoint (no {MANIFEST} with a "
                                     f"valid header{why}); point at the directory given to "
                                     "LayerCheck")
        return self.header

    def latest_step(self) -> int | None:
        return max(self.states) if self.states else None

    def base_of(self, version: Version) -> Version | None:
        """The live full version that holds a partial ``version``'s frozen parameters
        (``format``: ``base``); None for a full version, or where it is not live."""
        if version.base is None or version.layer is None:
            return None
        return next((v for v in self.versions.get(version.layer, []) if v.step == version.base
                     and v.base is None), None)

    def all_versions(self) -> Iterable[Version]:
        for versions in self.versions.values():
            yield from versions
        yield from self.states.values()

    def apply(self, record: dict[str, Any]) -> None:
        """Replay one record (checked by ``format.check_record``: ``decode_line``)."""
        kind = record["kind"]
        if kind == "header":
            if self.header is None:
                self.header = record
        elif kind == "layer":
            version = Version.from_record(record, self.rank)
            self.versions.setdefault(version.layer, []).append(version)
        elif kind == "state":
            version = Version.from_record(record, self.rank)
            self.states[version.step] = version
        elif kind == "resume":
            self._truncate(record["step"])
        elif kind == "drop":
            self._drop(record["file"])
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


def read_manifest(store: Store, rank: int | None = None) -> ManifestView:
    """Replay the store's manifest (as ``rank`` sees a sharded one). Damaged
    lines are skipped and listed in ``problems``; an absent manifest gives an
    empty view (no header)."""
    return _replay(_manifest_bytes(store), rank)


def read_again(store: Store, view: ManifestView) -> ManifestView:
    """The store's manifest as it is now, as ``view``'s rank sees it: ``view`` itself
    where not a byte changed since it was read (a replay costs tens of microseconds
    a line; a check for damage that reads the manifest again is then free)."""
    data = _manifest_bytes(store)
    return view if data == view.source else _replay(data, view.rank)


def _manifest_bytes(store: Store) -> bytes:
    return store.read(MANIFEST) if store.exists(MANIFEST) else b""


def _replay(data: bytes, rank: int | None) -> ManifestView:
    view = ManifestView(rank=rank, source=data)
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
            view.skipped.append(line)
    return view


def encode_manifest(header: dict[str, Any], versions: Iterable[Version]) -> bytes:
    """A whole manifest: the header, then ``versions`` by step, each step's state last."""
    ordered = sorted(versions, key=lambda v: (v.step, v.layer is None, v.layer or ""))
    return encode_record(header) + b"".join(encode_record(v.to_record()) for v in ordered)


def compact(store: Store) -> int:
    """Rewrite the manifest with only what replaying it keeps: the header, the live
    versions and, as they are, the lines it skips (so ``inspect`` still reports
    them). Replaying the result gives the same header, versions and states;
    records of retired versions, drop and resume records are gone. Atomic
    (``write_atomic``): a crash leaves the old manifest or the new one, never a
    mix. Call only where nothing else appends meanwhile (the directory's
    writer, from the thread that appends). Returns the size it now has."""
    view = read_manifest(store)
    if view.header is None:
        raise LayerCheckError(f"{store.url}: no header to keep, so the manifest is not compacted")
    data = encode_manifest(view.header, view.all_versions()) + b"".join(
        line + b"\n" for line in view.skipped)
    store.write_atomic(MANIFEST, data)
    return len(data)


def read_consistent(store: Store, prepare: Callable[[ManifestView], T],
                    suspects: Callable[[T], Iterable[Version]], finish: Callable[[T], R], *,
                    attempts: int = 8) -> R:
    """``finish(prepare(view))`` on a snapshot of the manifest, for readers that hold
    no lock (``inspect``, ``plan``, ``export``) beside a trainer that may change the
    directory meanwhile: append, retire versions (``keep_versions``: a drop record,
    then the files) or start a new timeline (overwriting files of the abandoned one).

    ``prepare`` reads and changes nothing; ``finish`` may write (an export folder).
    What ``prepare`` found damaged (``suspects(prepared)``: the versions a plan
    passed over, or an inspection found wrong) and damaged manifest lines are
    believed only if they are still so in the manifest as it is now; otherwise both
    run again on the new one, and ``finish`` never sees a result that is not
    believed. An error (CorruptVersion, CheckpointNotFound) is believed once the
    manifest did not change while it was found. So a reader never passes over, nor
    reports as damaged, a version that was only retired, and never exports a
    composite that was not recoverable. All of it under ``store.reading()``, so
    a trainer's retention deletes no file meanwhile (its drop records still
    appear): retries are for what that cannot hold off (a new timeline
    overwriting abandoned files, an append in flight). LayerCheckError if the
    directory changed under every one of ``attempts`` tries."""
    with store.reading():  # a trainer's retention deletes no file meanwhile
        return _consistent(store, prepare, suspects, finish, attempts)


def _consistent(store: Store, prepare: Callable[[ManifestView], T],
                suspects: Callable[[T], Iterable[Version]], finish: Callable[[T], R],
                attempts: int) -> R:
    data, failure = _manifest_bytes(store), None
    for _ in range(attempts):
        view = _replay(data, None)
        try:
            prepared = prepare(view)
            suspected = set(suspects(prepared))
            if not (view.problems or suspected):
                return finish(prepared)
            data = _manifest_bytes(store)
            now = _replay(data, None)
            if suspected <= set(now.all_versions()) and set(view.problems) <= set(now.problems):
                return finish(prepared)  # still live, still damaged: so they are
        except (CorruptVersion, CheckpointNotFound) as exc:
            fresh = _manifest_bytes(store)
            if fresh == data:  # nothing moved while it was found: so it is
                raise
            data, failure = fresh, exc
    last = f"; the last try found: {failure}" if failure is not None else ""
    raise LayerCheckError(f"{store.url} changed under each of {attempts} tries to read it (a "
                          "running trainer starting a new timeline?): try again, or stop the "
                          f"trainer{last}")


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


@dataclass(frozen=True)
class VerifiedFile:
    """A committed safetensors file as read and verified (``read_verified_file``):
    its bytes, its parsed header (tensor name -> dtype, shape, data_offsets; and
    ``__metadata__``) and where its data section starts in ``data``.

    Read with ``apart``, the tensors named in ``apart_keys`` are in the buffer
    ``apart`` instead (back to back, in file order), and ``data`` holds the rest
    of the file (the header, then the other tensors, in file order): ``places``
    says where each tensor is."""

    data: ReadBuffer
    header: dict[str, Any]
    data_start: int
    apart: ReadBuffer | None = None
    apart_keys: frozenset[str] = frozenset()
    frozen: "VerifiedFile | None" = None
    """A partial version's full version, verified too (``with_frozen``): its tensors
    ``frozen_keys`` complete this file's."""
    frozen_keys: tuple[str, ...] = ()
    referenced: Mapping[str, Any] = field(default_factory=dict)
    """Frozen parameters read from a pretrained file (``layercheck.pretrained``) and
    verified there: tensors by key, which complete this file's too."""

    @property
    def metadata(self) -> dict[str, str]:
        return self.header.get("__metadata__") or {}

    @property
    def nbytes(self) -> int:
        """The memory holding the file (and its full version's, and what it references)."""
        own = len(self.data) + (len(self.apart) if self.apart is not None else 0)
        refs = sum(t.numel() * t.element_size() for t in self.referenced.values())
        return own + refs + (self.frozen.nbytes if self.frozen is not None else 0)

    def with_frozen(self, full: "VerifiedFile", keys: tuple[str, ...], what: str) -> "VerifiedFile":
        """This file completed by the tensors ``keys`` of ``full`` (a partial version's
        full version, verified); CorruptVersion naming ``what`` if it lacks one."""
        missing = [key for key in keys if key not in full.header]
        if missing:
            raise CorruptVersion(f"{what}: its full version holds no {missing[0]}, which the "
                                 "manifest says it holds")
        return dataclasses.replace(self, frozen=full, frozen_keys=keys)

    def places(self) -> dict[str, tuple[ReadBuffer, int]]:
        """Per tensor (header order): the buffer holding its bytes, and where they start."""
        spans = {key: entry["data_offsets"] for key, entry in self.header.items()
                 if key != "__metadata__"}
        if self.apart is None:
            return {key: (self.data, self.data_start + start) for key, (start, _) in spans.items()}
        places, moved = {}, 0  # moved: bytes of earlier tensors that are apart
        for key, (start, stop) in sorted(spans.items(), key=lambda item: tuple(item[1])):
            if key in self.apart_keys:
                places[key] = (self.apart, moved)
                moved += stop - start
            else:
                places[key] = (self.data, self.data_start + start - moved)
        return {key: places[key] for key in spans}


def read_verified_file(store: Store, version: Version,
                       apart: Callable[[str], bool] | None = None) -> VerifiedFile:
    """The file of ``version`` read once into a buffer and verified on it: CorruptVersion
    if missing, not a regular file, of another size, failing its checksum (computed
    as the bytes arrive), not structured as a safetensors file (the manifest's
    checksum proves only that the file is what was recorded, not that what was
    recorded is sane) or saying it holds another version. An I/O error is not
    damage: ReadFailed. Safe to call from several threads at once.

    ``apart``: the tensors whose key it accepts are read into a buffer of their own
    (``VerifiedFile.apart``), where a caller can keep them (a fresh optimizer's
    moments) without keeping the rest of the file; the same checks, on the same
    bytes. The header is parsed as it arrives, to place the tensors; a header that
    does not parse leaves the file in one buffer, and the checks say what is wrong."""
    summer = Checksummer(version.checksum.partition(":")[0])
    split = _Split(version.bytes, apart) if apart is not None else None
    try:  # never more than the committed size (a link to /dev/zero is refused anyway)
        if split is None:
            data = read_buffer(store, version.file, version.bytes, summer.update)
            size = len(data)
        else:
            size = read_into(store, version.file, version.bytes, summer.update, split.targets)
            data = split.data
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, NotARegularFile) as exc:
        raise CorruptVersion(f"{version.file}: missing, or not the file committed "
                             f"({exc.__class__.__name__})") from None
    except OSError as exc:  # EIO, EACCES, a timeout: the file may be intact
        raise ReadFailed(f"{version.file}: cannot be read ({exc}): an I/O error, not damage, so "
                         "nothing was passed over; try again once the storage answers") from None
    if size != version.bytes:
        raise CorruptVersion(f"{version.file}: " + (
            f"{size} bytes on disk, {version.bytes} committed" if size < version.bytes
            else f"longer on disk than the {version.bytes} bytes committed"))
    if summer.value != version.checksum:
        raise CorruptVersion(f"{version.file}: checksum mismatch (the file changed after commit)")
    if split is not None and split.header is not None:  # parsed from these same bytes
        verified = VerifiedFile(data, split.header, split.data_start, split.apart,
                                split.apart_keys)
    else:
        header, data_start = parse_header(data, version.file)
        verified = VerifiedFile(data, header, data_start)
    _check_identity(verified.metadata, version)
    return verified


class _Split:
    """Where each byte of a safetensors file of ``size`` bytes goes when the tensors
    that ``apart`` accepts are read apart (``read_verified_file``): ``targets`` yields
    the buffers to fill, in file order, placing the tensors once the header is in."""

    def __init__(self, size: int, apart: Callable[[str], bool]) -> None:
        self.size, self.accept = size, apart
        self.header: dict[str, Any] | None = None
        self.data_start = 0
        self.data: ReadBuffer = np.empty(0, dtype=np.uint8)
        self.apart: ReadBuffer | None = None
        self.apart_keys: frozenset[str] = frozenset()

    def targets(self, size: int) -> Iterator[memoryview]:
        """The buffers for a read of ``size`` bytes (what the store found; a size other
        than the committed one is refused after the read, so it is read whole)."""
        head = np.empty(min(8, size), dtype=np.uint8)
        yield memoryview(head)
        n = int.from_bytes(head.tobytes(), "little") if len(head) == 8 else -1
        header = None
        if size == self.size and 0 <= n <= size - 8:
            text = np.empty(n, dtype=np.uint8)
            yield memoryview(text)
            head = np.concatenate([head, text])
            try:
                header = _header(bytes(text), n, size, "")
            except CorruptVersion:
                header = None
        if header is None:  # read it whole; the checks after the read say what is wrong
            self.data = np.empty(size, dtype=np.uint8)
            self.data[:len(head)] = head
            yield memoryview(self.data[len(head):])
            return
        spans = sorted((tuple(entry["data_offsets"]), key) for key, entry in header.items()
                       if key != "__metadata__")
        keys = frozenset(key for _, key in spans if self.accept(key))
        moved = sum(stop - start for (start, stop), key in spans if key in keys)
        self.data = np.empty(size - moved, dtype=np.uint8)
        self.apart = np.empty(moved, dtype=np.uint8) if keys else None
        self.data[:len(head)] = head
        self.header, self.data_start, self.apart_keys = header, len(head), keys
        runs: list[list[Any]] = []  # [apart?, bytes]: neighbours bound for one buffer, merged
        for (start, stop), key in spans:
            into = key in keys
            if runs and runs[-1][0] == into:
                runs[-1][1] += stop - start
            else:
                runs.append([into, stop - start])
        at = {False: len(head), True: 0}  # where the next bytes go, in data and in apart
        for into, length in runs:
            if length:
                buffer = self.apart if into else self.data
                yield memoryview(buffer[at[into]:at[into] + length])  # type: ignore[index]
                at[into] += length


def read_verified(store: Store, version: Version) -> ReadBuffer:
    """The bytes of ``version``'s file, verified as ``read_verified_file`` does."""
    return read_verified_file(store, version).data


def _check_identity(metadata: dict[str, str], version: Version) -> None:
    """CorruptVersion unless the file says it is ``version``'s: its layer (or a training
    state), its step and, where recorded, its rank. A record naming another file, with
    that file's checksum, must not put one layer's tensors into another."""
    try:
        layer, step, rank = described(metadata)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptVersion(f"{version.file}: its metadata does not say what it holds "
                             f"({exc.__class__.__name__}: {exc})") from None
    what = lambda l, s: f"layer {l} of step {s}" if l is not None else f"the training state of step {s}"  # noqa: E731
    if (layer, step) != (version.layer, version.step):
        raise CorruptVersion(f"{version.file}: holds {what(layer, step)}, but the manifest "
                             f"names it as {what(version.layer, version.step)}")
    if rank is not None and version.rank is not None and rank != version.rank:
        raise CorruptVersion(f"{version.file}: holds rank {rank}'s shard, but the manifest names "
                             f"it as rank {version.rank}'s")


def check_structure(data: bytes | ReadBuffer, what: str) -> dict[str, str]:
    """The metadata of the safetensors file ``data``; CorruptVersion unless it is
    laid out as one (``parse_header``). Cheap: no tensor is built."""
    header, _ = parse_header(data, what)
    return header.get("__metadata__") or {}


def parse_header(data: bytes | ReadBuffer, what: str) -> tuple[dict[str, Any], int]:
    """(header, start of the data section) of the safetensors file ``data``;
    CorruptVersion unless it is laid out as one: a JSON header whose tensors, each
    with a dtype and a shape of as many bytes as its offsets span, tile the data
    section exactly."""
    try:
        with memoryview(data) as view:
            (n,) = struct.unpack("<Q", view[:8])
            if n > len(data) - 8:
                raise ValueError(f"header of {n} bytes in a file of {len(data)}")
            text = bytes(view[8:8 + n])
    except Exception as exc:  # every way a header can be malformed means 'corrupt'
        raise CorruptVersion(f"{what}: not a valid safetensors file ({exc})") from None
    return _header(text, n, len(data), what), 8 + n


def _header(text: bytes, n: int, size: int, what: str) -> dict[str, Any]:
    """The header ``text`` (``n`` bytes) of a safetensors file of ``size`` bytes, checked
    as ``parse_header`` says; CorruptVersion otherwise."""
    try:
        header = json.loads(text)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        spans = []
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            start, stop = entry["data_offsets"]
            size_of = DTYPE_SIZES[entry["dtype"]]
            for extent in entry["shape"]:
                if not isinstance(extent, int) or extent < 0:
                    raise ValueError(f"tensor {key!r} has shape {entry['shape']!r}")
                size_of *= extent
            if not isinstance(start, int) or not isinstance(stop, int) or stop - start != size_of:
                raise ValueError(f"tensor {key!r}: offsets {start}..{stop} for {size_of} bytes")
            spans.append((start, stop))
        end = 0
        for start, stop in sorted(spans):
            if start != end or stop < start:
                raise ValueError("tensor data offsets do not tile the data section")
            end = stop
        if end != size - 8 - n:
            raise ValueError(f"tensors cover {end} of {size - 8 - n} data bytes")
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict):
            raise ValueError("__metadata__ is not an object")
        return header
    except Exception as exc:  # every way a header can be malformed means 'corrupt'
        raise CorruptVersion(f"{what}: not a valid safetensors file ({exc})") from None


DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "C64": 8}
"""Bytes per element of each safetensors dtype layercheck writes and reads
(``layerfile.DTYPES``; torch-free here, so the names are repeated)."""
