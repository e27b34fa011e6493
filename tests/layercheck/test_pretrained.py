"""Pretrained files read by reference: regular files only, read within bounds, never
blocking (the end-to-end runs: test_lora.py, test_reliability_hostile.py). Torch-free."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from layercheck.storage.checksums import checksum
from layercheck.contract.errors import CorruptVersion, LayerCheckError
from layercheck.storage.pretrained import PretrainedFiles, Ref, read_ref

DATA = bytes(range(16))


def _safetensors(path: Path, header: dict | None = None, data: bytes = DATA) -> Path:
    """A safetensors file of one float32 tensor 'w' of shape [4] (or ``header``)."""
    header = header or {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(data)]}}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_a_reference_reads_its_tensor_and_verifies_it(tmp_path):
    ref = Ref(str(_safetensors(tmp_path / "m.safetensors")), "w", checksum(DATA))
    assert read_ref(ref) == (DATA, "F32", [4])
    files = PretrainedFiles(tmp_path)
    assert files.find(DATA, "F32", (4,)) == ref


@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "link to /dev/zero", "folder"])
def test_a_pretrained_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    """Opened with open(), a FIFO blocked until someone wrote to it; /dev/zero would be
    read as far as a header said. Each is refused at the open, naming what it is."""
    folder = tmp_path / "pretrained"
    folder.mkdir()
    path = folder / "model.safetensors"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    what = {"fifo": "a FIFO", "link to a fifo": "a FIFO", "link to /dev/zero": "a device",
            "folder": "not a regular file"}[kind]
    with pytest.raises(LayerCheckError, match=f"is {what}; layercheck reads") as info:
        PretrainedFiles(folder)
    assert str(path) in str(info.value) and "give the folder" in str(info.value)
    with pytest.raises(CorruptVersion, match=f"is {what}") as info:
        read_ref(Ref(str(path), "w", checksum(DATA)))
    assert "put the pretrained files back" in str(info.value)


@pytest.mark.parametrize("header, data, wrong", [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}}, DATA,
     "outside the file's 16 bytes of data"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-8, 8]}}, DATA, "outside the file"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": ["0", 16]}}, DATA, "outside the file"),
    ([1, 2], DATA, "not a JSON object"),
], ids=["offsets past the end", "a negative offset", "an offset not an integer",
        "a header not an object"])
def test_a_pretrained_file_is_read_within_its_bounds(tmp_path, header, data, wrong):
    """A header's offsets beyond the file were read short and reported as a changed
    tensor; offsets, like the header's length, must lie within the file."""
    path = tmp_path / "m.safetensors"
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    with pytest.raises(CorruptVersion, match=wrong):
        read_ref(Ref(str(path), "w", checksum(DATA)))
    with pytest.raises(LayerCheckError, match=wrong):
        PretrainedFiles(path).find(DATA, "F32", (4,))


def test_a_header_longer_than_its_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", 50_000_000) + b"{}")
    with pytest.raises(CorruptVersion, match="a header of 50000000 bytes in a file of 10"):
        read_ref(Ref(str(path), "w", checksum(DATA)))


def test_a_reference_to_a_relative_path_is_refused(tmp_path, monkeypatch):
    """PretrainedFiles records absolute paths; a relative one (a damaged record) would be
    read from wherever the reader happens to run."""
    _safetensors(tmp_path / "m.safetensors")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CorruptVersion, match="relative path"):
        read_ref(Ref("m.safetensors", "w", checksum(DATA)))
