"""A committed layer or state file read back and verified: the reading side of ``layerfile``.

``layerfile`` lays a safetensors file out for writing (and imports torch);
this module reads one back and proves it is what the manifest committed:
read once into a buffer (or two, with the tensors a caller keeps read apart),
its checksum computed as the bytes arrive, its size, its safetensors layout
and what its metadata says it holds checked on those same bytes. Torch-free
(numpy only), so ``inspect`` and ``gc`` run without torch; ``recovery``
builds tensor views on the verified bytes. A module of its own, not part of
``layerfile.py``: that one imports torch, and together they would pass 400
lines.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..contract.errors import CorruptVersion, NotARegularFile, ReadFailed
from .format import Checksummer, Version, described
from .store import ReadBuffer, Store, read_buffer, read_into

__all__ = ["VerifiedFile", "read_verified_file", "read_verified", "placement",
           "check_structure", "parse_header", "DTYPE_SIZES"]


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
    """Frozen parameters read from a pretrained file (``layercheck.storage.pretrained``) and
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
        placed, places = placement(self.header, self.apart_keys), {}
        for key in (k for k in self.header if k != "__metadata__"):
            apart, at, _ = placed[key]
            places[key] = (self.apart, at) if apart else (self.data, self.data_start + at)
        return places


def placement(header: Mapping[str, Any], apart: frozenset[str] | set[str]
              ) -> dict[str, tuple[bool, int, int]]:
    """Where each tensor of a parsed safetensors ``header`` goes when those named in
    ``apart`` are read apart (``read_verified_file``), in file order: (read apart?,
    where its bytes start in its buffer, how many). The apart buffer holds those
    tensors back to back from 0; the rest of the file keeps its order, a tensor's
    place counted from the start of the data section less the bytes of the earlier
    tensors that went apart. The one computation of it: ``VerifiedFile.places``
    finds the tensors by it, ``_Split.targets`` reads them into place by it."""
    spans = sorted((tuple(entry["data_offsets"]), key) for key, entry in header.items()
                   if key != "__metadata__")
    placed, moved = {}, 0  # moved: bytes of earlier tensors that are apart
    for (start, stop), key in spans:
        if key in apart:
            placed[key] = (True, moved, stop - start)
            moved += stop - start
        else:
            placed[key] = (False, start - moved, stop - start)
    return placed


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
        keys = frozenset(key for key in header if key != "__metadata__" and self.accept(key))
        placed = placement(header, keys)
        moved = sum(length for into, _, length in placed.values() if into)
        self.data = np.empty(size - moved, dtype=np.uint8)
        self.apart = np.empty(moved, dtype=np.uint8) if keys else None
        self.data[:len(head)] = head
        self.header, self.data_start, self.apart_keys = header, len(head), keys
        runs: list[list[Any]] = []  # [apart?, start, bytes]: neighbours bound for one buffer
        for into, at, length in placed.values():  # file order: a buffer's next bytes follow
            if runs and runs[-1][0] == into:
                runs[-1][2] += length
            else:
                runs.append([into, at, length])
        for into, at, length in runs:
            if length:
                buffer, base = (self.apart, 0) if into else (self.data, len(head))
                yield memoryview(buffer[base + at:base + at + length])  # type: ignore[index]


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
