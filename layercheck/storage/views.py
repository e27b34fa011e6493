"""A verified file's tensors as views of its bytes: what a restore checks is what it applies.

``tensor_views`` gives each tensor of a ``layerread.VerifiedFile`` as a view of
the buffer it was read into (no copy), its frozen parameters from its full
version's file and from the pretrained files it references (``referenced``);
``Loaded`` names the tensors read apart. ``parse_safetensors`` copies them out
of a blob instead. ``recovery`` re-exports all three.
"""
from __future__ import annotations

import warnings

import torch

from .layerfile import DTYPES
from .layerread import VerifiedFile, parse_header
from .pretrained import Ref, read_ref

__all__ = ["Loaded", "tensor_views", "parse_safetensors", "referenced", "DTYPES_BY_NAME"]


DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
"""The torch dtype of each safetensors dtype the writer stores (``layerfile.DTYPES``,
inverted); ``layerread.DTYPE_SIZES`` has their sizes."""


class Loaded(dict):
    """A file's tensors by key (``tensor_views``); those named in ``own`` were read
    apart (``read_verified_file(apart=...)``): memory holding nothing else of the
    file, that a source may keep as live state instead of copying
    (``LayerSource.apply``)."""

    own: frozenset[str] = frozenset()


def tensor_views(file: VerifiedFile) -> Loaded:
    """The tensors of a verified file (header order), each a view of its bytes: no
    copy, and they keep their buffer alive while any of them lives."""
    tensors = Loaded()
    tensors.own = file.apart_keys
    if file.frozen is not None:  # a partial version: its frozen parameters from its full one
        full = tensor_views(file.frozen)
        tensors.update((key, full[key]) for key in file.frozen_keys)
    tensors.update(file.referenced)  # and those a pretrained file holds
    for key, (buffer, offset) in file.places().items():
        entry = file.header[key]
        dtype, (start, stop) = DTYPES_BY_NAME[entry["dtype"]], entry["data_offsets"]
        if stop == start:  # no elements: frombuffer refuses an empty view
            tensors[key] = torch.empty(entry["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=dtype, offset=offset,
                                count=(stop - start) // dtype.itemsize)
        tensors[key] = flat.view(entry["shape"])
    return tensors


def parse_safetensors(data: bytes | bytearray,
                      what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (copies, not views of ``data``) and metadata of a safetensors blob
    (no pickle); CorruptVersion if malformed."""
    header, data_start = parse_header(data, what)
    with warnings.catch_warnings():  # read-only bytes: the views are only copied from
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        views = tensor_views(VerifiedFile(data, header, data_start))  # type: ignore[arg-type]
        return {key: view.clone() for key, view in views.items()}, header.get("__metadata__") or {}


def referenced(ref: Ref) -> torch.Tensor:
    """The tensor a pretrained file holds at ``ref``, verified (``read_ref``)."""
    data, dtype, shape = read_ref(ref)
    kind = DTYPES_BY_NAME[dtype]
    if not data:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(data), dtype=kind).view(shape)
