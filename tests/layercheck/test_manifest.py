"""The manifest log: commit marker, torn and garbled lines, hostile paths, timelines."""
from __future__ import annotations

import pytest

from layercheck.errors import LayerCheckError
from layercheck.format import MANIFEST, Version, encode_record
from layercheck.manifest import read_manifest
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
