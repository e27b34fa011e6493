"""A layer file laid out as header + tensor views is the file safetensors writes, and
reads back as the tensors and metadata it was given."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from layercheck.storage.layerfile import layout
from layercheck.storage.layerread import check_structure

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]


def _tensors() -> dict[str, torch.Tensor]:
    """Every dtype the writer meets, each as a matrix, a non-contiguous view, a 0-d
    scalar and an empty tensor."""
    torch.manual_seed(0)
    out = {}
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        base = (torch.randn(5, 7) * 50).to(dtype)
        out[f"param/{name}"] = base
        out[f"optim/t/{name}"] = base.t()[1:, ::2]  # strided: made contiguous on write
        out[f"optim/s/{name}"] = base[2, 3].clone()  # 0-d
        out[f"buffer/{name}"] = torch.empty(0, 4, dtype=dtype)
    return out


def _joined(file) -> bytes:
    return b"".join(bytes(b) for b in file.buffers())


def test_every_dtype_round_trips_through_safetensors():
    tensors = _tensors()
    metadata = {"format": "layercheck-layer/1", "layer": "enc.0", "step": "7",
                "state": json.dumps({"é": [1, "\n\x01"]})}
    data = _joined(layout(tensors, metadata))
    back = st_load(data)
    assert back.keys() == tensors.keys()
    for key, tensor in tensors.items():
        assert back[key].dtype == tensor.dtype and back[key].shape == tensor.shape, key
        assert torch.equal(back[key], tensor), key
    assert check_structure(data, "the file") == metadata


def test_the_bytes_are_those_safetensors_writes(tmp_path):
    """Same tensor order, same data, same header (metadata keys aside: safetensors
    lists them in a hash map's order), same padding."""
    tensors = _tensors()
    metadata = {"layer": "enc.0"}  # one key: no order to differ in
    data = _joined(layout(tensors, metadata))
    reference = st_save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    assert data == reference
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == metadata
        assert torch.equal(handle.get_tensor("param/bfloat16"), tensors["param/bfloat16"])


def test_without_metadata_and_without_tensors():
    assert _joined(layout({}, None)) == st_save({})
    data = _joined(layout({"a": torch.zeros(3)}, {}))
    assert data == st_save({"a": torch.zeros(3)}, metadata={})
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0 and check_structure(data, "f") == {}


def test_tensor_bytes_are_views_of_the_tensors_own_memory():
    weight = torch.randn(256, 256)
    file = layout({"w": weight, "b": torch.zeros(4)}, {"layer": "x"})
    buffers = list(file.buffers())
    assert len(buffers) == 3  # header, then one per tensor
    views = [np.frombuffer(b, dtype=np.uint8) for b in buffers[1:]]
    assert any(np.shares_memory(v, weight.numpy()) for v in views)
    assert sum(b.nbytes for b in buffers) == file.nbytes == len(_joined(file))


@pytest.mark.parametrize("tensors, metadata, says", [
    ({"s": torch.zeros(3).to_sparse()}, None, "dense CPU tensor"),
    ({"c": torch.zeros(2, dtype=torch.complex128)}, None, "convert it"),
    ({"n": np.zeros(2)}, None, "not a tensor"),
    ({"a": torch.zeros(2)}, {"step": 3}, "json.dumps"),
])
def test_what_safetensors_cannot_store_is_refused_saying_the_fix(tensors, metadata, says):
    with pytest.raises(ValueError, match=says):
        layout(tensors, metadata)


def test_every_dtype_the_writer_stores_restore_reads_back():
    """The writer's dtype table and restore's agree: a file holding every dtype
    ``layout`` accepts (complex64 and the float8s included) passes the structure
    check and comes back as equal tensors through restore's views."""
    from layercheck.storage.layerfile import DTYPES as STORED
    from layercheck.storage.layerread import DTYPE_SIZES, VerifiedFile, parse_header
    from layercheck.recovery import tensor_views
    assert {name: DTYPE_SIZES[name] for name in STORED.values()} == \
        {name: dtype.itemsize for dtype, name in STORED.items()}
    torch.manual_seed(0)
    tensors = {f"param/{name}": (torch.randn(3, 5) * 4).to(dtype) for dtype, name in STORED.items()
               if not dtype.is_complex}
    tensors["param/C64"] = torch.randn(3, 5, dtype=torch.complex64)
    data = np.frombuffer(bytearray(_joined(layout(tensors, {"layer": "x"}))), dtype=np.uint8)
    header, start = parse_header(data, "the file")
    back = tensor_views(VerifiedFile(data, header, start))
    assert back.keys() == tensors.keys()
    for key, tensor in tensors.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
