"""Reading a version of another layout: the `read` callable, FSDP2's rows, the refusal."""
from __future__ import annotations

import pytest
import torch

from layercheck.backends.elastic import ElasticRead, chunk_rows, rows
from layercheck.contract.errors import CorruptVersion, LayerCheckError, ModelMismatch
from layercheck.storage.format import Layout, Shard, Version, checksum, layer_metadata
from layercheck.storage.layerfile import layout as lay_out
from layercheck.storage.layerread import read_verified_file
from layercheck.backends.source import LayerSource
from layercheck.storage.localstore import LocalStore

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


# --- a directory of two layouts, in one process -------------------------------------------
def _as_two_ranks(ckpt, steps, backend="fsdp", layers=None):
    """Rewrite every layer version of ``steps`` in ``ckpt`` (a plain module's) as FSDP2 on
    2 ranks would have written it (each weight and moment split by rows of dim 0, the
    scalars and buffers on both), in a layout recorded after the header; returns the
    original tensors of each rewritten version by (layer, step); ``layers``: only those."""
    from layercheck.storage.format import MANIFEST, decode_line, encode_record
    from layercheck.recovery import parse_safetensors
    store = LocalStore(ckpt)
    lines = (ckpt / MANIFEST).read_bytes().splitlines(keepends=True)
    records = [decode_line(line) for line in lines]
    params = {}
    out, originals = [], {}
    for record in records:
        if record["kind"] != "layer" or record["step"] not in steps or \
                (layers is not None and record["layer"] not in layers):
            out.append(record)
            continue
        tensors, _ = parse_safetensors((ckpt / record["file"]).read_bytes(), record["file"])
        originals[(record["layer"], record["step"])] = tensors
        split = [{}, {}]
        for key, value in tensors.items():
            name = key.rsplit("/", 1)[-1]
            if value.dim() and not key.startswith("buffer/"):
                params[name] = {"shape": list(value.shape), "dim": 0, "dtype": "float32"}
                for rank, part in enumerate(torch.chunk(value, 2)):
                    split[rank][key] = part.clone()
            else:
                split[0][key] = split[1][key] = value
        version = _commit(store, split, step=record["step"], layer=record["layer"])
        out.append({**{k: v for k, v in record.items() if k not in ("file", "bytes", "checksum")},
                    "shards": [s.to_record() for s in version.shards], "layout": 1})
    layout = Layout(id=1, world_size=2, facts={backend: {
        "world_size": 2, "params": params, "param_groups": [sorted(params)], "aliases": {}}})
    out.insert(1, layout.to_record())
    (ckpt / MANIFEST).write_bytes(b"".join(encode_record(r) for r in out))
    return originals


@pytest.fixture
def two_layouts(tmp_path):
    from tests.conftest import every_layer_checkpoint
    ckpt = every_layer_checkpoint(tmp_path / "ckpt", steps=6)
    return ckpt, _as_two_ranks(ckpt, {5, 6})


def _fresh():
    from layercheck import LayerCheck, LayerCheckConfig
    from tests.conftest import optimizer_for, tiny_lm
    model = tiny_lm(seed=1)
    opt, sched = optimizer_for(model, total=20)
    return model, opt, sched, lambda d: LayerCheck(model, opt, d, LayerCheckConfig(),
                                                   scheduler=sched)


def test_a_plain_restore_joins_the_two_rank_versions_of_a_mixed_composite_exactly(two_layouts):
    ckpt, originals = two_layouts
    model, opt, _, make = _fresh()
    with make(ckpt) as lc:
        assert lc.restore() == 6
        sources = lc.restored.plan.sources
        assert {v.layout for v in sources.values()} == {1}  # newest: the 2-rank versions
        for name, version in sources.items():
            saved = originals[(name, version.step)]
            for pname, p in lc.layer_map.parameters(lc.layer_map.index[name]):
                assert torch.equal(p.detach(), saved[f"param/{pname}"]), pname
                for field in ("exp_avg", "exp_avg_sq", "step"):
                    assert torch.equal(opt.state[p][field], saved[f"optim/{field}/{pname}"])
        assert lc.layout.id == 0  # a plain job again: it writes in the header's layout


def test_a_damaged_shard_of_another_layout_is_passed_over_like_any_version(two_layouts):
    ckpt, originals = two_layouts
    view = __import__("layercheck.storage.manifest", fromlist=["read_manifest"]).read_manifest(
        LocalStore(ckpt))
    newest = view.versions["model.layers.1"][-1]
    path = ckpt / newest.shards[1].file
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.write_bytes(bytes(data))
    model, opt, _, make = _fresh()
    with pytest.warns(UserWarning, match="model.layers.1.*step 6.*checksum"), make(ckpt) as lc:
        assert lc.restore() == 6
        version = lc.restored.plan.sources["model.layers.1"]
        assert (version.step, version.layout) == (5, 1)
        (pname, p), *_ = lc.layer_map.parameters(lc.layer_map.index["model.layers.1"])
        assert torch.equal(p.detach(), originals[("model.layers.1", 5)][f"param/{pname}"])


def test_what_a_source_cannot_reshard_is_refused_before_anything_changes(tmp_path):
    from tests.conftest import every_layer_checkpoint
    ckpt = every_layer_checkpoint(tmp_path / "ckpt", steps=6)
    _as_two_ranks(ckpt, {6}, backend="zero")
    model, opt, _, make = _fresh()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with make(ckpt) as lc, pytest.raises(ModelMismatch) as refused:
        lc.restore()
    assert "its version of step 6 was written by 2 ranks, this job has 1" in str(refused.value)
    # one process reads ZeRO's versions now (pieces.zero_layer_tensors); these files are
    # FSDP2's under a layout that claims ZeRO without its facts
    assert "malformed ZeRO facts in the layout" in str(refused.value)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_inspect_plan_and_gc_on_a_directory_of_two_layouts(two_layouts, capsys):
    import json

    from layercheck.tools.cleanup import collect_garbage
    from layercheck.tools.cli import main as cli
    from layercheck.tools.inspection import format_inspection, inspect_directory
    from layercheck.storage.manifest import read_manifest
    ckpt, originals = two_layouts
    info = inspect_directory(LocalStore(ckpt))
    assert info["problems"] == []
    layers = len(info["layers"])
    assert info["layouts"] == [  # steps 2..6 of every layer, 5 and 6 in the 2-rank layout
        {"id": 0, "world_size": 1, "backend": None, "layer_versions": 3 * layers, "states": 5},
        {"id": 1, "world_size": 2, "backend": "fsdp", "layer_versions": 2 * layers, "states": 0}]
    assert "layouts: 0: 1 x plain" in format_inspection(info)
    assert cli(["plan", str(ckpt), "--step", "6", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert {layer["layout"] for layer in planned["layers"]} == {1}
    report = collect_garbage(LocalStore(ckpt), keep=2)
    assert report.kept_steps == [5, 6] and report.skipped == []
    view = read_manifest(LocalStore(ckpt))
    assert view.problems == [] and view.layouts[1].world_size == 2  # the layout is kept
    assert all(len(v.shards) == 2 for vs in view.versions.values() for v in vs if v.step >= 5)
    model, opt, _, make = _fresh()
    with make(ckpt) as lc:  # and the composite restores as before gc
        assert lc.restore() == 6
        (pname, p), *_ = lc.layer_map.parameters(0)
        assert torch.equal(p.detach(), originals[(lc.layer_map.names[0], 6)][f"param/{pname}"])


def test_an_hf_export_joins_each_version_by_its_own_layout(tmp_path):
    """Two layers' newest versions of a 2-rank layout, the others a plain module's."""
    from safetensors.torch import load_file

    from layercheck.tools.cli import main as cli
    from layercheck.recovery import parse_safetensors
    from tests.conftest import every_layer_checkpoint
    ckpt = every_layer_checkpoint(tmp_path / "ckpt", steps=6)
    plain = {}
    for path in ckpt.glob("layers/*@000000006.safetensors"):
        plain.update(parse_safetensors(path.read_bytes(), path.name)[0])
    rewritten = _as_two_ranks(ckpt, {6}, layers={"model.layers.0", "model.layers.1"})
    assert len(rewritten) == 2
    assert cli(["export", str(ckpt), "--step", "6", "--out", str(tmp_path / "hf")]) == 0
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    params = {key[6:]: value for key, value in plain.items() if key.startswith("param/")}
    assert params and set(params) <= set(exported)
    for name, value in params.items():
        assert torch.equal(exported[name], value), name
