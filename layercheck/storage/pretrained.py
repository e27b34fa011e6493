"""Frozen weights that come unchanged from a pretrained model's files: recorded, not written.

``LayerCheck(..., pretrained="folder")`` names the safetensors files the model
was loaded from (a folder's ``*.safetensors``, or one file). At the base
checkpoint (and any full version, ``format``: frozen tensors), a frozen
parameter whose bytes, dtype and shape equal a tensor of those files is not
written: the layer record names it by reference (``refs``: file, tensor key
and the checksum of its bytes), and a restore reads it from there and
verifies the checksum (``read_ref``: CorruptVersion where the file is gone or
its tensor changed). Matching is by content (``PretrainedFiles.find``), not by
name: a PEFT model renames its base weights (``base_layer``), a task model
prefixes them.

A record names a pretrained file by absolute path, outside the checkpoint
directory: it is opened only as a regular file (``fds.open_regular``,
links followed to the file they resolve to, as a Hugging Face cache links a
snapshot's files to their blobs; a FIFO, a device or a folder refused without
blocking), and read within bounds: a header of at most ``MAX_HEADER`` bytes
and within the file, each tensor within the file's data. Torch-free: bytes
in, bytes out.
"""
from __future__ import annotations

import json
import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .checksums import checksum
from ..contract.errors import CorruptVersion, LayerCheckError, NotARegularFile
from .fds import open_regular, read_at

__all__ = ["Ref", "PretrainedFiles", "read_ref"]


@dataclass(frozen=True)
class Ref:
    """A tensor of a pretrained file: where, and the checksum of its bytes."""

    file: str
    key: str
    checksum: str

    def to_record(self) -> dict[str, str]:
        return {"file": self.file, "key": self.key, "checksum": self.checksum}


MAX_HEADER = 100_000_000
"""The largest safetensors header read (the safetensors library's own limit)."""
_UNREADABLE = (OSError, KeyError, ValueError, TypeError, RecursionError, struct.error,
               NotARegularFile)
"""What a pretrained file that cannot be read raises here (``read_ref``, ``_build``)."""


@contextmanager
def _opened(path: str | Path) -> Iterator[tuple[int, int, dict[str, Any], int]]:
    """(descriptor, size, safetensors header, where its data starts) of the pretrained
    file at ``path``, a regular file (see the module doc); closed on exit."""
    fd = open_regular(Path(path), os.O_RDONLY, follow=True)
    try:
        size = os.fstat(fd).st_size
        (n,) = struct.unpack("<Q", read_at(fd, 8, 0))
        if n > min(MAX_HEADER, size - 8):
            raise ValueError(f"a header of {n} bytes in a file of {size}")
        header = json.loads(read_at(fd, n, 8))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        yield fd, size, header, 8 + n
    finally:
        os.close(fd)


def _tensor(fd: int, size: int, start: int, entry: Any) -> bytes:
    """The bytes of the tensor whose header ``entry`` it is, within the file's data."""
    begin, end = entry["data_offsets"]
    if not all(isinstance(x, int) for x in (begin, end)) or not 0 <= begin <= end <= size - start:
        raise ValueError(f"data offsets {begin}..{end} outside the file's {size - start} bytes "
                         "of data")
    return read_at(fd, end - begin, start + begin)


def read_ref(ref: Ref) -> tuple[bytes, str, list[int]]:
    """(bytes, safetensors dtype, shape) of the referenced tensor, its checksum
    verified; CorruptVersion saying the fix if the file is gone, is not a regular
    file, or the tensor changed."""
    fix = ("put the pretrained files back as they were when training started, or restore "
           "from a directory written without pretrained=")
    if not os.path.isabs(ref.file):  # never resolved against the working directory
        raise CorruptVersion(f"{ref.file!r}: the frozen tensor {ref.key} is recorded by "
                             "reference to a relative path, where layercheck records an "
                             f"absolute one (a damaged record): {fix}")
    try:
        with _opened(ref.file) as (fd, size, header, start):
            entry = header[ref.key]
            data = _tensor(fd, size, start, entry)
    except _UNREADABLE as exc:
        raise CorruptVersion(f"{ref.file}: the frozen tensor {ref.key} recorded by reference "
                             f"cannot be read ({exc.__class__.__name__}: {exc}): {fix}") from None
    if checksum(data, ref.checksum.partition(":")[0]) != ref.checksum:
        raise CorruptVersion(f"{ref.file}: tensor {ref.key} differs from the one recorded "
                             f"(checksum): the pretrained file changed; {fix}")
    return data, entry["dtype"], list(entry["shape"])


class PretrainedFiles:
    """The tensors of a pretrained model's safetensors files, by content."""

    def __init__(self, where: str | Path) -> None:
        path = Path(where).expanduser().resolve()
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        fix = "give the folder (or file) the model's weights were loaded from"
        if not files or not all(os.path.lexists(f) for f in files):
            raise LayerCheckError(f"pretrained={where}: no safetensors files there; {fix}")
        for file in files:  # each a regular file (links followed): never a FIFO, a device
            try:
                os.close(open_regular(file, os.O_RDONLY, follow=True))
            except (OSError, NotARegularFile) as exc:
                raise LayerCheckError(f"pretrained={where}: {exc}; {fix}") from None
        self.files = files
        self._index: dict[tuple[str, tuple[int, ...], str], Ref] | None = None

    def find(self, data: bytes | memoryview, dtype: str, shape: tuple[int, ...]) -> Ref | None:
        """The pretrained tensor with exactly these bytes, dtype and shape, if any. The
        files are indexed at the first call (each read once)."""
        if self._index is None:
            self._index = self._build()
        return self._index.get((dtype, tuple(shape), checksum(data)))

    def _build(self) -> dict[tuple[str, tuple[int, ...], str], Ref]:
        index = {}
        for path in self.files:
            try:
                with _opened(path) as (fd, size, header, start):
                    for key, entry in header.items():
                        if key == "__metadata__":
                            continue
                        digest = checksum(_tensor(fd, size, start, entry))
                        index.setdefault((entry["dtype"], tuple(entry["shape"]), digest),
                                         Ref(str(path), key, digest))
            except _UNREADABLE as exc:
                raise LayerCheckError(f"pretrained: {path} is not a readable safetensors file "
                                      f"({exc.__class__.__name__}: {exc})") from None
        return index
