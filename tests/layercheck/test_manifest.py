"""The manifest log: commit marker, torn and garbled lines, hostile paths, timelines."""
from __future__ import annotations

import pytest

from layercheck.errors import LayerCheckError
from layercheck.format import MANIFEST, Version, encode_record
from layercheck.manifest import compact, read_manifest
from layercheck.store import LocalStore, check_relative, open_store


def _layer(step, name="a"):
    return Version(step=step, file=f"layers/{name}@{step:09d}.safetensors", bytes=1,
                   checksum="crc32:00000000", layer=name, reason="threshold").to_record()


def _state(step):
    return Version(step=step, file=f"states/{step:09d}.safetensors", bytes=1,
                   checksum="crc32:00000000").to_record()


def _write(store, *records, tail=b""):
    store.append(MANIFEST, b"".join(encode_record(r) for r in records) + tail)


def test_torn_last_line_and_garbage_are_skipped_with_a_reason(tmp_path):
    store = LocalStore(tmp_path)
    line = encode_record(_state(2))
    _write(store, {"kind": "header", "layers": [{"name": "a", "kind": "block", "params": 1}]},
           _layer(1), _state(1),
           tail=b"garbage that is not json\n" + line[: len(line) // 2])
    view = read_manifest(store)
    assert sorted(view.states) == [1]
    assert len(view.problems) == 2
    assert "torn" in view.problems[1] or "newline" in view.problems[1]


def test_a_flipped_byte_in_a_record_fails_its_crc(tmp_path):
    store = LocalStore(tmp_path)
    line = bytearray(encode_record(_state(7)))
    line[line.index(b"7")] = ord("8")
    store.append(MANIFEST, bytes(line))
    view = read_manifest(store)
    assert view.states == {} and "CRC" in view.problems[0]


def test_resume_abandons_the_later_timeline(tmp_path):
    store = LocalStore(tmp_path)
    _write(store, {"kind": "header", "layers": []}, _layer(5), _state(5), _layer(6), _state(6),
           {"kind": "resume", "step": 5}, _layer(6, "b"), _state(6))
    view = read_manifest(store)
    assert [v.step for v in view.versions["a"]] == [5]
    assert [v.step for v in view.versions["b"]] == [6]


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "layers/../../x", "a//b", "", "a/./b"])
def test_paths_cannot_escape_the_directory(path):
    with pytest.raises(LayerCheckError, match="relative"):
        check_relative(path)


def test_hostile_path_in_a_record_is_a_problem_not_a_read(tmp_path):
    store = LocalStore(tmp_path)
    bad = _state(3) | {"file": "../../etc/passwd"}
    _write(store, {"kind": "header", "layers": []}, bad)
    view = read_manifest(store)
    assert view.states == {} and "refusing path" in view.problems[0]


def test_open_store_kinds(tmp_path):
    assert isinstance(open_store(tmp_path / "new"), LocalStore)
    with pytest.raises(LayerCheckError, match="no such checkpoint directory"):
        open_store(tmp_path / "absent", create=False)
    mem = open_store("memory://lc-manifest-test")
    mem.append("m.jsonl", b"a\n")
    mem.append("m.jsonl", b"b\n")
    assert mem.read("m.jsonl") == b"a\nb\n"


def _replayed(view):
    return (view.header, {n: [(v.step, v.file, v.bytes) for v in vs]
                          for n, vs in view.versions.items() if vs},
            {s: v.file for s, v in view.states.items()}, len(view.problems))


def test_compaction_replays_to_the_same_versions_and_keeps_damaged_lines(tmp_path):
    """Records of retired and abandoned versions, drop and resume records go; what
    replay keeps stays, and so do damaged lines (inspect still reports them)."""
    store = LocalStore(tmp_path)
    header = {"kind": "header", "layers": [{"name": "a", "kind": "block", "params": 1},
                                           {"name": "b", "kind": "block", "params": 1}]}
    _write(store, header, _layer(1), _layer(1, "b"), _state(1), _layer(2), _state(2),
           {"kind": "drop", "file": _state(1)["file"]}, _layer(3), _state(3),
           {"kind": "resume", "step": 2}, tail=b"garbage that is not json\n")
    _write(store, _layer(3, "b"), _state(3), {"kind": "drop", "file": _layer(1)["file"]})
    before = read_manifest(store)
    size = compact(store)
    after = read_manifest(store)
    assert _replayed(after) == _replayed(before)
    assert size == store.size(MANIFEST) < len(encode_record(header)) + 5 * len(
        encode_record(_layer(3, "b"))) + len(b"garbage that is not json\n")
    assert b"garbage that is not json\n" in store.read(MANIFEST)


def _train_every_step(path, steps):
    import torch
    from layercheck import LayerCheck, LayerCheckConfig
    from tests.conftest import optimizer_for, tiny_lm, train_step
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=steps)
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                              keep_versions=1)
    with LayerCheck(model, opt, path, config, scheduler=sched) as lc:
        lc.restore()
        for _ in range(steps):
            train_step(model, opt, sched)
            lc.step()
    return LocalStore(path)


def test_under_retention_the_manifest_is_compacted_while_training(tmp_path, monkeypatch):
    """keep_versions=1 with every layer written every step: the manifest grew by each
    version's record and its drop record forever (issue 13: 18 MiB after 15,000 steps),
    and every restore replayed it all. Now it stays near its compaction size, and
    replays to exactly what the same run's uncompacted manifest does."""
    from layercheck import writer
    monkeypatch.setattr(writer, "COMPACT_BYTES", 1 << 40)
    grown = _train_every_step(tmp_path / "grown", 40)
    monkeypatch.setattr(writer, "COMPACT_BYTES", 8 << 10)
    kept = _train_every_step(tmp_path / "kept", 40)
    assert grown.size(MANIFEST) > 5 * kept.size(MANIFEST)
    assert kept.size(MANIFEST) < 2 * (8 << 10)
    view, reference = read_manifest(kept), read_manifest(grown)
    assert view.latest_step() == 40 and view.problems == []
    assert _replayed(view)[1:] == _replayed(reference)[1:]
    assert view.header["layers"] == reference.header["layers"]
