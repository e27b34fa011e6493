"""A safetensors file laid out without serialising it: a header, then views of the tensors.

Contract: ``layout(tensors, metadata)`` returns a ``LayerFile`` whose
``buffers()`` yield, in order, the file's bytes: the 8-byte little-endian
header length and the JSON header (``__metadata__`` first, padded with spaces
to 8-byte alignment), then each tensor's raw bytes as a zero-copy view of the
tensor's own memory. Nothing holds the whole file: a writer streams the
buffers to disk (``Store.write_atomic``) and feeds the same buffers to its
checksum. The bytes are those ``safetensors.torch.save`` produces for the
same tensors and metadata (same tensor order, same header; metadata keys
sorted, where safetensors lists them in a hash map's order), so
``safetensors.torch.load``/``safe_open`` read them back as they were.

Tensors must be on the CPU; non-contiguous ones are made contiguous (a copy
of that tensor only). The views stay valid while the ``LayerFile`` lives; the
tensors must not change until the buffers are written.
"""
from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

__all__ = ["DTYPES", "LayerFile", "layout"]

DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8",
    torch.float8_e5m2: "F8_E5M2", torch.float8_e4m3fn: "F8_E4M3",
    torch.int16: "I16", torch.uint16: "U16", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int32: "I32", torch.uint32: "U32", torch.float32: "F32", torch.complex64: "C64",
    torch.float64: "F64", torch.int64: "I64", torch.uint64: "U64",
}
"""Torch dtypes and their safetensors names, in safetensors' own dtype order: a
file lists its tensors by that order descending, then by name (as ``save`` does).
Restore reads them back by the same table (``recovery.tensor_views``); their sizes
are ``layerread.DTYPE_SIZES``."""
_RANK = {name: i for i, name in enumerate(DTYPES.values())}


@dataclass(frozen=True)
class LayerFile:
    """A safetensors file as a header and the tensors that follow it (see the module doc)."""

    header: bytes
    """The length prefix and the padded JSON header."""
    tensors: tuple[torch.Tensor, ...]
    """Contiguous CPU tensors, in file order."""

    @property
    def nbytes(self) -> int:
        """The size of the file."""
        return len(self.header) + sum(t.numel() * t.element_size() for t in self.tensors)

    def buffers(self) -> Iterator[memoryview]:
        """The file's bytes in order, as byte views (empty tensors yield nothing)."""
        yield memoryview(self.header)
        for tensor in self.tensors:
            if tensor.numel():
                yield memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def layout(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
           ) -> LayerFile:
    """The safetensors file of ``tensors`` and ``metadata`` (string values), laid out
    for streaming; ValueError naming the tensor if one cannot be stored."""
    if sys.byteorder != "little":
        raise ValueError("layercheck writes safetensors files (little-endian) only on a "
                         "little-endian host")
    order = sorted(tensors, key=lambda key: (-_RANK[_dtype(key, tensors[key])], key))
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = _metadata(metadata)
    stored, offset = [], 0
    for key in order:
        tensor = _stored(key, tensors[key])
        size = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + size]}
        stored.append(tensor)
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return LayerFile(struct.pack("<Q", len(text)) + text, tuple(stored))


def _dtype(key: str, tensor: torch.Tensor) -> str:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{key!r} is a {type(tensor).__name__}, not a tensor: a layer file "
                         "holds tensors only")
    if tensor.dtype not in DTYPES:
        raise ValueError(f"tensor {key!r} has dtype {tensor.dtype}, which safetensors cannot "
                         f"store; convert it to one of {', '.join(map(str, DTYPES))}")
    return DTYPES[tensor.dtype]


def _stored(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as it is written: dense, contiguous, on the CPU, without autograd."""
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        raise ValueError(f"tensor {key!r} is a {tensor.layout} tensor on {tensor.device}: copy "
                         "it to a dense CPU tensor first (the writer persists host snapshots)")
    return tensor.detach().resolve_conj().resolve_neg().contiguous()


def _metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"metadata {key!r}: {value!r} is not a string pair; safetensors "
                             "metadata maps strings to strings (json.dumps other values)")
    return dict(sorted(metadata.items()))  # safetensors' own order is a hash map's
