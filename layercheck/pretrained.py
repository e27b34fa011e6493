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
prefixes them. Torch-free: bytes in, bytes out.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checksums import checksum
from .errors import CorruptVersion, LayerCheckError

__all__ = ["Ref", "PretrainedFiles", "read_ref"]


@dataclass(frozen=True)
class Ref:
    """A tensor of a pretrained file: where, and the checksum of its bytes."""

    file: str
    key: str
    checksum: str

    def to_record(self) -> dict[str, str]:
        return {"file": self.file, "key": self.key, "checksum": self.checksum}


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """(safetensors header, where its data starts) of the file at ``path``."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100_000_000:
            raise ValueError(f"a header of {n} bytes")
        return json.loads(f.read(n)), 8 + n


def read_ref(ref: Ref) -> tuple[bytes, str, list[int]]:
    """(bytes, safetensors dtype, shape) of the referenced tensor, its checksum
    verified; CorruptVersion saying the fix if the file is gone or the tensor changed."""
    fix = ("put the pretrained files back as they were when training started, or restore "
           "from a directory written without pretrained=")
    try:
        header, start = _header(Path(ref.file))
        entry = header[ref.key]
        begin, end = entry["data_offsets"]
        with open(ref.file, "rb") as f:
            f.seek(start + begin)
            data = f.read(end - begin)
    except (OSError, KeyError, ValueError, TypeError, struct.error) as exc:
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
        if not files or not all(f.is_file() for f in files):
            raise LayerCheckError(f"pretrained={where}: no safetensors files there; give the "
                                  "folder (or file) the model's weights were loaded from")
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
                header, start = _header(path)
                with open(path, "rb") as f:
                    for key, entry in header.items():
                        if key == "__metadata__":
                            continue
                        begin, end = entry["data_offsets"]
                        f.seek(start + begin)
                        digest = checksum(f.read(end - begin))
                        index.setdefault((entry["dtype"], tuple(entry["shape"]), digest),
                                         Ref(str(path), key, digest))
            except (OSError, KeyError, ValueError, TypeError, struct.error) as exc:
                raise LayerCheckError(f"pretrained: {path} is not a readable safetensors file "
                                      f"({exc.__class__.__name__}: {exc})") from None
        return index
