"""Layouts in the manifest (issue 30): records, replay, shard counts, compaction. Torch-free."""
from __future__ import annotations

import subprocess
import sys

import pytest

from layercheck.storage.format import (MANIFEST, Layout, Shard, Version, check_record,
                                       encode_record, layout_record)
from layercheck.storage.manifest import compact, encode_manifest, read_manifest
from layercheck.storage.localstore import LocalStore

LAYERS = [{"name": "a", "kind": "block", "params": 1}]
FSDP = {"fsdp": {"world_size": 2, "params": {"w": {"shape": [4, 2], "dim": 0, "dtype": "float32"}}}}
HEADER = {"kind": "header", "format": "layercheck/1", "layers": LAYERS, "world_size": 2, **FSDP}


def _version(step, world, layout=0, layer="a"):
    stem = f"layers/{layer}@{step:09d}" if layer else f"states/{step:09d}"
    shards = tuple(Shard(f"{stem}.rank{r:05d}.safetensors", 10 + r, f"crc32:{r:08x}")
                   for r in range(world)) if world > 1 else ()
    file = shards[0].file if shards else f"{stem}.safetensors"
    return Version(step=step, file=file, bytes=10, checksum="crc32:00000000", layer=layer,
                   reason="threshold" if layer else None, shards=shards, layout=layout)


def _write(store, *records):
    store.append(MANIFEST, b"".join(encode_record(r) for r in records))


def _layer(step, world, layout=0):
    return _version(step, world, layout).to_record()


def _state(step, world, layout=0):
    return _version(step, world, layout, layer=None).to_record()


ONE = Layout(id=1, world_size=1, facts={})
THREE = Layout(id=2, world_size=3, facts=FSDP)


def test_layout_zero_is_the_headers_and_records_without_layout_are_of_it(tmp_path):
    store = LocalStore(tmp_path)
    _write(store, HEADER, _layer(1, 2), _state(1, 2))
    view = read_manifest(store)
    assert view.layouts == {0: Layout(id=0, world_size=2, facts=FSDP)}
    assert "layout" not in _layer(1, 2)  # layout 0: records as before issue 30
    assert view.layout_of(view.versions["a"][0]).world_size == 2
    plain = read_manifest(_plain(tmp_path / "plain"))
    assert plain.layouts[0] == Layout(id=0, world_size=1, facts={})


def _plain(path):
    store = LocalStore(path)
    _write(store, {"kind": "header", "layers": LAYERS}, _layer(1, 1), _state(1, 1))
    return store


def test_versions_of_several_layouts_replay_each_with_its_own_shards(tmp_path):
    store = LocalStore(tmp_path)
    _write(store, HEADER, _layer(1, 2), _state(1, 2), {"kind": "resume", "step": 1},
           layout_record(ONE), _layer(2, 1, 1), _state(2, 1, 1), {"kind": "resume", "step": 2},
           layout_record(THREE), _layer(3, 3, 2), _state(3, 3, 2))
    view = read_manifest(store)
    assert view.problems == []
    assert sorted(view.layouts) == [0, 1, 2] and view.layouts[2] == THREE
    assert [(v.step, v.layout, len(v.shards)) for v in view.versions["a"]] == [
        (1, 0, 2), (2, 1, 0), (3, 2, 3)]
    assert [view.layout_of(v).world_size for v in view.versions["a"]] == [2, 1, 3]
    # rank 2 of a 3-rank job sees its own shard of layout 2, rank 0's of layout 0
    ranked = read_manifest(store, rank=2)
    first, _, third = ranked.versions["a"]
    assert first.file.endswith("rank00000.safetensors") and first.rank == 0
    assert third.file.endswith("rank00002.safetensors") and third.rank == 2
    assert ranked.states[1].file.endswith("rank00000.safetensors")  # its RNG: rank 0's


def test_a_record_with_other_shards_than_its_layout_or_an_unknown_layout_is_skipped(tmp_path):
    store = LocalStore(tmp_path)
    _write(store, HEADER, _layer(1, 3), _layer(2, 1, 1), layout_record(ONE), _layer(3, 2, 1),
           _layer(4, 1, 1), layout_record(ONE))
    view = read_manifest(store)
    assert [v.step for v in view.versions["a"]] == [4]
    assert "3 shards in a version of layout 0, which 2 ranks (fsdp) wrote" in view.problems[0]
    assert "layout 1, which no layout record before it describes" in view.problems[1]
    assert "2 shards in a version of layout 1" in view.problems[2]
    assert "layout 1 is recorded twice" in view.problems[3]


def test_the_layout_record_is_checked_by_its_schema():
    with pytest.raises(ValueError, match="layout record: id"):
        check_record({"kind": "layout", "id": 0, "world_size": 1, "facts": {}})  # 0: the header's
    with pytest.raises(ValueError, match="world_size"):
        check_record({"kind": "layout", "id": 1, "world_size": 0, "facts": {}})
    with pytest.raises(ValueError, match="layout"):
        check_record({**_layer(1, 1), "layout": -1})
    with pytest.raises(ValueError, match="Layout"):
        Layout(id=1, world_size=0)


def test_compaction_and_encode_manifest_keep_every_layout(tmp_path):
    store = LocalStore(tmp_path)
    _write(store, HEADER, _layer(1, 2), _state(1, 2), {"kind": "resume", "step": 1},
           layout_record(ONE), _layer(2, 1, 1), _state(2, 1, 1))
    before = read_manifest(store)
    compact(store)
    after = read_manifest(store)
    assert after.problems == [] and after.layouts == before.layouts
    assert after.versions == before.versions and after.states == before.states
    again = LocalStore(tmp_path / "again")
    again.append(MANIFEST, encode_manifest(HEADER, before.all_versions(), before.layouts.values()))
    assert read_manifest(again).versions == before.versions


def test_a_job_writes_in_the_layout_of_its_world_size_and_backend():
    zero = Layout.of_header(HEADER)
    assert zero.same_job(2, {"fsdp": {"world_size": 2, "units": []}})  # other facts: check's
    assert not zero.same_job(1, {"fsdp": {}}) and not zero.same_job(2, {})
    assert ONE.same_job(1, {}) and ONE.describe() == "1 process (plain module)"
    assert THREE.header() == {"world_size": 3, **FSDP}


def test_layouts_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; "
            "import layercheck.storage.layout, layercheck.storage.version, layercheck.storage.manifest")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_retention_counts_versions_of_every_layout_alike(tmp_path):
    from layercheck.storage.retention import Retention
    store = LocalStore(tmp_path)
    _write(store, HEADER, _layer(1, 2), _state(1, 2), {"kind": "resume", "step": 1},
           layout_record(ONE), _layer(2, 1, 1), _state(2, 1, 1))
    retention = Retention(1, read_manifest(store))
    newer = [_version(3, 1, 1), _version(3, 1, 1, layer=None)]
    dropped = retention.committed(newer)
    # keep 1: the 2-rank version of step 1 and the plain one of step 2 both go, and the
    # states they served; the drop records name rank 0's file of the sharded one
    assert [(v.step, v.layer, v.layout) for v in dropped] == [
        (1, None, 0), (2, None, 1), (1, "a", 0), (2, "a", 1)]
    assert dropped[2].key == "layers/a@000000001.rank00000.safetensors"


def test_zero3_and_zero12_at_the_same_world_size_are_different_layouts():
    """Their partitions can have the same sizes but hold other elements: a job of the other
    flat layout must read the versions elastically, never as its own (issue 30)."""
    two = Layout(id=0, world_size=2, facts={"zero": {"stage": 2}})
    assert two.same_job(2, {"zero": {"stage": 1}})  # one flat layout: stage 1 and 2 alike
    assert not two.same_job(2, {"zero": {"stage": 3}})
    assert not Layout(id=0, world_size=2, facts={"zero": {"stage": 3}}).same_job(
        2, {"zero": {"stage": 2}})
