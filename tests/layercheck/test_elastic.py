"""Reading a version of another layout: the `read` callable, FSDP2's rows, the refusal."""
from __future__ import annotations

import pytest
import torch

from layercheck.elastic import ElasticRead, chunk_rows, rows
from layercheck.errors import CorruptVersion, LayerCheckError, ModelMismatch
from layercheck.format import Layout, Shard, Version, checksum, layer_metadata
from layercheck.layerfile import layout as lay_out
from layercheck.layerread import read_verified_file
from layercheck.source import LayerSource
from layercheck.store import LocalStore

W = torch.arange(20, dtype=torch.float32).reshape(5, 4)


def _commit(store, tensors_per_rank, step=3, layer="a"):
    """A version of ``layer`` with one shard per rank, written and committed as a writer does."""
    shards = []
    for rank, tensors in enumerate(tensors_per_rank):
        file = lay_out(tensors, layer_metadata(layer, step, rank))
        data = b"".join(bytes(b) for b in file.buffers())
        path = f"layers/{layer}@{step:09d}.rank{rank:05d}.safetensors"
        store.write_atomic(path, data)
        shards.append(Shard(path, len(data), checksum(data)))
    return Version(step=step, file=shards[0].file, bytes=shards[0].bytes,
                   checksum=shards[0].checksum, layer=layer, reason="threshold",
                   shards=tuple(shards), rank=0)


def _fsdp(world):
    return Layout(id=1, world_size=world, facts={"fsdp": {"world_size": world, "params": {
        "w": {"shape": [5, 4], "dim": 0, "dtype": "float32"}}}})


def _read(store, version, layout, fetched):
    def fetch(rank):
        fetched.append(rank)
        return read_verified_file(store, version.per_rank()[rank])
    return ElasticRead(version, layout, fetch)


def test_chunk_rows_are_torch_chunks_with_empty_trailing_ranks():
    for n in range(0, 9):
        for world in range(1, 5):
            sizes = [len(c) for c in torch.chunk(torch.zeros(n), world)] if n else []
            sizes += [0] * (world - len(sizes))
            assert [b - a for a, b in chunk_rows(n, world)] == sizes, (n, world)


def test_read_opens_only_the_files_a_call_touches_and_each_once(tmp_path):
    store = LocalStore(tmp_path)
    chunks = torch.chunk(W, 3)  # rows 2, 2, 1
    version = _commit(store, [{"param/w": c} for c in chunks])
    fetched = []
    read = _read(store, version, _fsdp(3), fetched)
    # rows 1..3 of the whole tensor: the end of rank 0's slice and the start of rank 1's
    assert torch.equal(rows(read, _fsdp(3), "w", "param/w", (5, 4), 1, 3), W[1:3])
    assert fetched == [0, 1]
    assert torch.equal(rows(read, _fsdp(3), "w", "param/w", (5, 4), 0, 5), W)
    assert fetched == [0, 1, 2] and read.nbytes == sum(s.bytes for s in version.shards)
    assert torch.equal(read(2, "param/w", 0, 4), W[4])


def test_read_raises_corrupt_version_for_a_damaged_file_so_the_plan_falls_back(tmp_path):
    store = LocalStore(tmp_path)
    version = _commit(store, [{"param/w": c} for c in torch.chunk(W, 2)])
    path = tmp_path / version.shards[1].file
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    read = _read(store, version, _fsdp(2), [])
    assert torch.equal(read(0, "param/w", 0, 4), W[0])  # rank 0's file is intact
    with pytest.raises(CorruptVersion, match="checksum"):
        read(1, "param/w", 0, 4)
    with pytest.raises(LayerCheckError, match="a rank from 0 to 1"):
        read(2, "param/w", 0, 1)
    with pytest.raises(ModelMismatch, match="holds no param/v"):
        read(0, "param/v", 0, 1)


def test_rows_of_a_plain_version_come_from_its_one_file(tmp_path):
    store = LocalStore(tmp_path)
    version = _commit(store, [{"param/w": W}])
    plain = Layout(id=0, world_size=1, facts={})
    read = _read(store, version, plain, [])
    assert torch.equal(rows(read, plain, "w", "param/w", (5, 4), 3, 5), W[3:])


def test_what_rows_cannot_read_is_refused_with_the_reason(tmp_path):
    store = LocalStore(tmp_path)
    version = _commit(store, [{"param/w": c} for c in torch.chunk(W, 2)])
    other = Layout(id=1, world_size=2, facts={"fsdp": {"params": {
        "w": {"shape": [5, 4], "dim": 1, "dtype": "float32"}}}})
    read = _read(store, version, other, [])
    with pytest.raises(ModelMismatch, match="sharded along dim 1.*rows of dim 0 only"):
        rows(read, other, "w", "param/w", (5, 4), 0, 5)
    with pytest.raises(ModelMismatch, match=r"shape \(5, 4\) in the checkpoint but \(6, 4\)"):
        rows(read, _fsdp(2), "w", "param/w", (6, 4), 0, 5)
    zero = Layout(id=1, world_size=2, facts={"zero": {}})
    with pytest.raises(ModelMismatch, match="flat partitions"):
        rows(read, zero, "w", "param/w", (5, 4), 0, 5)


def test_a_source_without_apply_elastic_is_refused_before_anything_is_read():
    class Fixed(LayerSource):
        resize_advice = "export it and load the export"

    source = Fixed()
    written = Layout(id=0, world_size=2, facts={"zero": {}})
    untouched = lambda *a: pytest.fail("read called")  # noqa: E731
    with pytest.raises(ModelMismatch, match="Fixed cannot reshard a version that 2 ranks "
                                            r"\(zero\) wrote: export it and load the export"):
        source.check_elastic(0, written, untouched)
    with pytest.raises(LayerCheckError, match="cannot reshard"):
        source.apply_elastic(0, written, untouched)
    assert source.elastic_ranks(0, written) == [0, 1]
