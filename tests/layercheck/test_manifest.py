"""The manifest log: commit marker, torn and garbled lines, hostile paths, timelines."""
from __future__ import annotations

import pytest

from layercheck.contract.errors import LayerCheckError
from layercheck.storage.format import MANIFEST, Version, encode_record
from layercheck.storage.manifest import compact, read_manifest
from layercheck.storage.localstore import LocalStore
from layercheck.storage.store import check_relative
from layercheck.storage.location import open_store


def _layer(step, name="a"):
    return Version(step=step, file=f"layers/{name}@{step:09d}.safetensors", bytes=1,
                   checksum="crc32:00000000", layer=name, reason="threshold").to_record()


def _state(step):
    return Version(step=step, file=f"states/{step:09d}.safetensors", bytes=1,
                   checksum="crc32:00000000").to_record()


HEADER = {"kind": "header", "layers": [{"name": name, "kind": "block", "params": 1}
                                      for name in ("a", "b", "c")]}


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
    _write(store, HEADER, _layer(5), _state(5), _layer(6), _state(6),
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
    _write(store, HEADER, bad)
    view = read_manifest(store)
    assert view.states == {} and "refusing path" in view.problems[0]


def test_open_store_kinds(tmp_path):
    assert isinstance(open_store(tmp_path / "new"), LocalStore)
    with pytest.raises(LayerCheckError, match="no such checkpoint directory"):
        open_store(tmp_path / "absent", create=False)
    import uuid
    mem = open_store(f"memory://lc-manifest-{uuid.uuid4().hex}")  # memory:// outlives the test
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
    from layercheck.storage import writer
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


# -- reading a committed file: verified against its record ---------------------------------
def _committed(store, *, layer="a", step=3, rank=None, metadata=None, name="layers/f.safetensors"):
    import numpy as np
    import safetensors.numpy
    from layercheck.storage.format import checksum, layer_metadata
    data = safetensors.numpy.save({"w": np.arange(4, dtype=np.float32), "b": np.ones(2, np.int64)},
                                  metadata=metadata if metadata is not None else layer_metadata(layer, step, rank))
    store.write_atomic(name, data)
    return data, Version(step=step, file=name, bytes=len(data), checksum=checksum(data),
                         layer=layer, reason="threshold", rank=rank)


def test_a_committed_file_is_read_once_and_verified(tmp_path):
    import dataclasses
    from layercheck.contract.errors import CorruptVersion, ReadFailed
    from layercheck.storage.layerread import check_structure, read_verified, read_verified_file
    store = LocalStore(tmp_path)
    data, version = _committed(store)
    verified = read_verified_file(store, version)
    assert bytes(verified.data) == data and bytes(read_verified(store, version)) == data
    n = int.from_bytes(data[:8], "little")
    assert verified.data_start == 8 + n and set(verified.header) == {"w", "b", "__metadata__"}
    assert verified.metadata == {"format": "layercheck-layer/1", "layer": "a", "step": "3"}
    assert check_structure(data, "x") == verified.metadata
    cases = {
        dataclasses.replace(version, bytes=len(data) + 1): f"{len(data)} bytes on disk, {len(data) + 1} committed",
        dataclasses.replace(version, bytes=len(data) - 1): f"longer on disk than the {len(data) - 1} bytes committed",
        dataclasses.replace(version, checksum="crc32:00000000"): "checksum mismatch (the file changed after commit)",
        dataclasses.replace(version, file="layers/none.safetensors"): "missing, or not the file committed (FileNotFoundError)",
        dataclasses.replace(version, layer="b"): "holds layer a of step 3, but the manifest names it as layer b of step 3",
        dataclasses.replace(version, step=4): "holds layer a of step 3, but the manifest names it as layer a of step 4",
        dataclasses.replace(version, layer=None): "holds layer a of step 3, but the manifest names it as the training state of step 3",
    }
    for bad, says in cases.items():
        with pytest.raises(CorruptVersion) as err:
            read_verified_file(store, bad)
        assert str(err.value) == f"{bad.file}: {says}"
    _, sharded = _committed(store, rank=1, name="layers/r.safetensors")
    assert read_verified_file(store, sharded).metadata["rank"] == "1"
    with pytest.raises(CorruptVersion, match="holds rank 1's shard, but the manifest names it as rank 0's"):
        read_verified_file(store, dataclasses.replace(sharded, rank=0))
    _, anonymous = _committed(store, metadata={"x": "y"}, name="layers/n.safetensors")
    with pytest.raises(CorruptVersion, match=r"its metadata does not say what it holds \(KeyError"):
        read_verified_file(store, anonymous)

    class Failing(LocalStore):
        def read_buffer(self, path, limit=None, consume=None):
            raise OSError(5, "Input/output error")

    with pytest.raises(ReadFailed) as err:
        read_verified_file(Failing(tmp_path), version)
    assert str(err.value) == (f"{version.file}: cannot be read ([Errno 5] Input/output error): an "
                              "I/O error, not damage, so nothing was passed over; try again once "
                              "the storage answers")


def _file(header, data=b""):
    import json as _json
    body = _json.dumps(header).encode()
    return len(body).to_bytes(8, "little") + body + data


@pytest.mark.parametrize("raw,says", [
    (b"\x00" * 4, "unpack requires"),
    ((1000).to_bytes(8, "little") + b"{}", "header of 1000 bytes in a file of 10"),
    (_file([1, 2]), "the header is not a JSON object"),
    (_file({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "has shape [-1]"),
    (_file({"t": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, b"\0" * 8), "has shape [2.0]"),
    (_file({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "offsets 0..4 for 8 bytes"),
    (_file({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}}, b"\0" * 4), "offsets 0.0..4 for 4 bytes"),
    (_file({"t": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3), "do not tile"),
    (_file({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            "u": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3), "do not tile"),
    (_file({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 3), "tensors cover 2 of 3 data bytes"),
    (_file({"t": {"dtype": "X9", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2), "'X9'"),
    (_file({"__metadata__": [1]}), "__metadata__ is not an object"),
    ((2 ** 64 - 1).to_bytes(8, "little") + b"{}", f"header of {2 ** 64 - 1} bytes in a file of 10"),
    ((3).to_bytes(8, "little") + b"{}", "header of 3 bytes in a file of 10"),
    (_file({"t": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3),
     "tensor data offsets do not tile the data section"),
])
def test_a_malformed_safetensors_file_is_corrupt_saying_how(raw, says):
    from layercheck.contract.errors import CorruptVersion
    from layercheck.storage.layerread import check_structure, parse_header
    with pytest.raises(CorruptVersion) as err:
        parse_header(raw, "layers/x")
    assert str(err.value).startswith("layers/x: not a valid safetensors file (") and says in str(err.value)
    if not says[0].isalpha() or says.startswith(("the header", "tensor data", "__metadata__", "header of")):
        assert str(err.value) == f"layers/x: not a valid safetensors file ({says})"
    with pytest.raises(CorruptVersion) as err:
        check_structure(raw, "layers/y")
    assert str(err.value).startswith("layers/y: not a valid safetensors file (")


def test_well_formed_files_parse_with_and_without_tensors():
    from layercheck.storage.layerread import check_structure, parse_header
    empty = _file({})
    assert parse_header(empty, "x") == ({}, len(empty)) and check_structure(empty, "x") == {}
    raw = _file({"__metadata__": {"k": "v"}, "a": {"dtype": "BF16", "shape": [2, 0], "data_offsets": [0, 0]},
                 "b": {"dtype": "I16", "shape": [3], "data_offsets": [0, 6]}}, b"\1" * 6)
    header, start = parse_header(raw, "x")
    assert start == len(raw) - 6 and header["b"]["shape"] == [3] and check_structure(raw, "x") == {"k": "v"}


# -- read_consistent: a lock-free reader beside a trainer that changes the manifest -------


def test_a_consistent_read_believes_only_what_is_still_so():
    import uuid
    from layercheck.storage.manifest import read_consistent
    store = open_store(f"memory://consistent-{uuid.uuid4().hex}")
    _write(store, HEADER, _layer(1), _state(1), _layer(2), _state(2))
    calls = []

    def prepare(view):  # what a planner does: passes over a version it found damaged
        calls.append(sorted(view.states))
        if len(calls) == 1:  # meanwhile the trainer retires that version (drop record)
            _write(store, {"kind": "drop", "file": _layer(2)["file"]})
        return [v for v in view.versions["a"] if v.step == 2]

    # nothing suspected, no damaged line: finished at once
    assert read_consistent(store, lambda v: sorted(v.states), lambda p: [], lambda p: ("done", p)) == ("done", [1, 2])
    # the suspect was only retired: not believed, read again on the new manifest
    assert read_consistent(store, prepare, lambda p: p, lambda p: [v.step for v in p]) == []
    assert len(calls) == 2
    # a suspect still live in the manifest is believed
    _write(store, _layer(3), _state(3))
    assert read_consistent(store, lambda v: v.versions["a"][-1:], lambda p: p,
                           lambda p: [v.step for v in p]) == [3]
    # a damaged line still there is believed too
    store.append(MANIFEST, b"garbage\n")
    assert read_consistent(store, lambda v: len(v.problems), lambda p: [], lambda p: p) == 1


def test_a_consistent_read_believes_an_error_only_if_nothing_moved_and_gives_up_in_time():
    import uuid
    from layercheck.contract.errors import CheckpointNotFound, CorruptVersion
    from layercheck.storage.manifest import read_consistent
    store = open_store(f"memory://consistent-{uuid.uuid4().hex}")
    _write(store, HEADER, _layer(1), _state(1))
    tries = []

    def flaky(view):  # fails while a trainer appends, then succeeds
        tries.append(1)
        if len(tries) < 3:
            _write(store, _layer(10 + len(tries)))
            raise CorruptVersion("moved")
        return "ok"

    assert read_consistent(store, flaky, lambda p: [], lambda p: p) == "ok" and len(tries) == 3
    with pytest.raises(CheckpointNotFound, match="still"):  # nothing moved: believed at once
        read_consistent(store, lambda v: (_ for _ in ()).throw(CheckpointNotFound("still")),
                        lambda p: [], lambda p: p)
    count = []

    def always_moving(view):
        count.append(1)
        _write(store, _layer(100 + len(count)))
        raise CorruptVersion(f"try {len(count)}")

    with pytest.raises(LayerCheckError) as err:
        read_consistent(store, always_moving, lambda p: [], lambda p: p, attempts=3)
    assert len(count) == 3
    assert str(err.value) == (f"{store.url} changed under each of 3 tries to read it (a running "
                              "trainer starting a new timeline?): try again, or stop the trainer; "
                              "the last try found: try 3")


def test_a_torn_tail_is_sealed_once_and_nothing_else_is_touched(tmp_path):
    from layercheck.storage.manifest import seal_torn_tail
    store = LocalStore(tmp_path)
    assert seal_torn_tail(store) is False and not store.exists(MANIFEST)  # no manifest
    store.append(MANIFEST, b"")
    assert seal_torn_tail(store) is False and store.read(MANIFEST) == b""  # empty
    _write(store, HEADER, _layer(1))
    whole = store.read(MANIFEST)
    assert seal_torn_tail(store) is False and store.read(MANIFEST) == whole  # ends whole
    line = encode_record(_state(1))
    store.append(MANIFEST, line[:10])  # a crash mid-append
    assert seal_torn_tail(store) is True
    assert store.read(MANIFEST) == whole + line[:10] + b"\n"
    assert seal_torn_tail(store) is False
    _write(store, _state(1))  # the next record is not glued to the torn bytes
    view = read_manifest(store)
    assert sorted(view.states) == [1] and len(view.problems) == 1
    store.append(MANIFEST, line[:10])
    assert read_manifest(store).problems[-1] == (
        f"{MANIFEST} line 5: skipped (torn append: the last line has no newline)")


@pytest.mark.parametrize("layers,wrong", [
    (None, "layers=None: a non-empty list of {name, kind, params} (the model's layers) is "
           "required"),
    ("a", "layers='a': a non-empty list of"), ([], "layers=[]: a non-empty list of"),
    ([["a", "block", 1]], "entry 0: not an object"),
    ([{"kind": "block", "params": 1}], "entry 0: name is missing"),
    ([{"name": "a", "params": 1}], "entry 0: kind is missing"),
    ([{"name": "a", "kind": "block"}], "entry 0: params is missing"),
    ([{"name": "a", "kind": "block", "params": "1"}],
     "entry 0: params='1': an integer from 0 to 2**63-1 is required"),
    ([{"name": 1, "kind": "block", "params": 1}], "entry 0: name=1: a string is required"),
    ([{"name": "a", "kind": "block", "params": 1}] * 2, "two entries have the same name")])
def test_a_malformed_header_is_a_problem_and_not_the_header(tmp_path, layers, wrong):
    """Each says what is wrong (the schema's message; it said 'malformed header' for
    every case before the record schema, issue 27)."""
    store = LocalStore(tmp_path)
    _write(store, {"kind": "header", "layers": layers}, {"kind": "bogus"}, _state(1))
    view = read_manifest(store)
    assert view.header is None and sorted(view.states) == [1]
    assert view.problems[0].startswith(f"{MANIFEST} line 1: skipped (header record: ")
    assert wrong in view.problems[0], view.problems[0]
    assert view.problems[1:] == [
        f"{MANIFEST} line 2: skipped (unknown record kind 'bogus')"]


def test_drop_and_resume_retire_exactly_what_they_name(tmp_path):
    store = LocalStore(tmp_path)
    assert read_manifest(store).problems == [] and read_manifest(store).states == {}  # no manifest
    _write(store, HEADER, _layer(1), _state(1), _layer(2), _state(2), _layer(3), _state(3),
           {"kind": "drop", "file": _layer(1)["file"]}, {"kind": "drop", "file": _state(1)["file"]})
    store.append(MANIFEST, b"\n\n")  # blank lines are no records, nor the end of them
    _write(store, {"kind": "resume", "step": 2})
    view = read_manifest(store)
    assert [v.step for v in view.versions["a"]] == [2] and sorted(view.states) == [2]
    assert view.resumes == [2] and view.problems == []


def test_compaction_orders_each_steps_layers_then_its_state_and_needs_a_header(tmp_path):
    import json
    from layercheck.storage.manifest import encode_manifest
    store = LocalStore(tmp_path)
    _write(store, HEADER, _state(2), _layer(2, "b"), _layer(2, "a"), _state(1), _layer(1, "c"))
    store.append(MANIFEST, b"damaged one\ndamaged two\n")
    compact(store)
    lines = store.read(MANIFEST).split(b"\n")
    kinds = [(r["kind"], r.get("step"), r.get("layer")) for r in
             (json.loads(l)["r"] for l in lines[:6])]
    assert kinds == [("header", None, None), ("layer", 1, "c"), ("state", 1, None),
                     ("layer", 2, "a"), ("layer", 2, "b"), ("state", 2, None)]
    assert lines[6:] == [b"damaged one", b"damaged two", b""]
    assert encode_manifest(HEADER, []) == encode_record(HEADER)
    bare = open_store(f"memory://bare-{tmp_path.name}-{id(store)}")
    _write(bare, _state(1))
    with pytest.raises(LayerCheckError) as err:
        compact(bare)
    assert str(err.value) == f"{bare.url}: no header to keep, so the manifest is not compacted"


def test_a_committed_file_that_is_no_safetensors_file_names_itself(tmp_path):
    from layercheck.contract.errors import CorruptVersion
    from layercheck.storage.format import checksum
    from layercheck.storage.layerread import read_verified_file
    store = LocalStore(tmp_path)
    store.write_atomic("layers/g.safetensors", b"garbage, checksummed all the same")
    version = Version(step=1, file="layers/g.safetensors", bytes=33,
                      checksum=checksum(b"garbage, checksummed all the same"), layer="a", reason="base")
    with pytest.raises(CorruptVersion, match=r"^layers/g\.safetensors: not a valid safetensors file \("):
        read_verified_file(store, version)


def test_a_consistent_read_tries_eight_times_by_default_and_says_when_nothing_was_found():
    import uuid
    from layercheck.storage.manifest import read_consistent
    store = open_store(f"memory://consistent-{uuid.uuid4().hex}")
    _write(store, HEADER, _layer(1), _state(1))
    tries = []

    def retired_each_time(view):  # a suspect that the trainer retires every time
        tries.append(1)
        suspect = view.versions["a"][-1]
        _write(store, _layer(20 + len(tries)), {"kind": "drop", "file": suspect.file})
        return [suspect]

    with pytest.raises(LayerCheckError) as err:
        read_consistent(store, retired_each_time, lambda p: p, lambda p: p)
    assert len(tries) == 8
    assert str(err.value) == (f"{store.url} changed under each of 8 tries to read it (a running "
                              "trainer starting a new timeline?): try again, or stop the trainer")
    # every live version suspected (the whole set, not a part of it): still believed
    assert read_consistent(store, lambda v: list(v.all_versions()), lambda p: p, len) == len(
        list(read_manifest(store).all_versions()))


# -- read apart: a fresh optimizer's moments in memory of their own (issue 14) ------------------
def test_a_file_read_apart_is_verified_as_a_whole_read_and_holds_only_the_chosen_tensors(tmp_path):
    """``apart`` places the chosen tensors in a buffer of their own and the rest in
    another; the tensors are those of a whole read, and every check says what it
    says for a whole read (size, checksum, identity), through either store."""
    import dataclasses
    import uuid
    import numpy as np
    import torch
    from layercheck.contract.errors import CorruptVersion
    from layercheck.storage.layerread import read_verified_file
    from layercheck.recovery import tensor_views
    for store in (LocalStore(tmp_path), open_store(f"memory://apart-{uuid.uuid4().hex}")):
        data, version = _committed(store)
        whole = read_verified_file(store, version)
        assert whole.apart is None
        reference = tensor_views(whole)
        for name in ("w", "b"):  # the file's last tensor, its first
            chosen = lambda key, name=name: key == name  # noqa: E731
            apart = read_verified_file(store, version, chosen)
            start, stop = (whole.data_start + at for at in whole.header[name]["data_offsets"])
            assert apart.apart_keys == {name} and bytes(apart.apart) == data[start:stop]
            assert bytes(apart.data) == data[:start] + data[stop:]  # the rest, in file order
            assert apart.nbytes == whole.nbytes == len(data)
            views = tensor_views(apart)
            assert views.own == {name} and list(views) == list(reference)
            for key in reference:
                assert torch.equal(views[key], reference[key]), key
            assert views[name].untyped_storage().data_ptr() == apart.apart.ctypes.data
            assert views[name].untyped_storage().nbytes() == stop - start  # nothing else
        none = read_verified_file(store, version, lambda key: False)
        assert none.apart is None and bytes(none.data) == data
        cases = [dataclasses.replace(version, bytes=len(data) + 1),
                 dataclasses.replace(version, bytes=len(data) - 1),
                 dataclasses.replace(version, checksum="crc32c:00000000"),
                 dataclasses.replace(version, file="layers/none.safetensors"),
                 dataclasses.replace(version, step=4)]
        for bad in cases:
            messages = []
            for how in (None, chosen):
                with pytest.raises(CorruptVersion) as err:
                    read_verified_file(store, bad, how)
                messages.append(str(err.value))
            assert messages[0] == messages[1]


def test_a_damaged_header_read_apart_is_reported_as_a_whole_read_reports_it(tmp_path):
    """The header is parsed before the checksum is known, only to place the tensors:
    a flipped header byte is still a checksum mismatch, and a header that is no
    safetensors header (checksummed all the same) is still named as such."""
    from layercheck.contract.errors import CorruptVersion
    from layercheck.storage.format import checksum
    from layercheck.storage.layerread import read_verified_file
    store = LocalStore(tmp_path)
    data, version = _committed(store)
    n = int.from_bytes(data[:8], "little")
    for at in (3, 8, 8 + n // 2, 8 + n - 1):  # in the length, at the header's start, middle, end
        damaged = bytearray(data)
        damaged[at] ^= 0x40
        store.write_atomic(version.file, bytes(damaged))
        resealed = Version(step=3, file=version.file, bytes=len(data), checksum=checksum(bytes(damaged)),
                           layer="a", reason="threshold")
        for bad in (version, resealed):
            messages = []
            for how in (None, lambda key: key == "w"):
                try:
                    read_verified_file(store, bad, how)
                    messages.append("read")
                except CorruptVersion as exc:
                    messages.append(str(exc))
            assert messages[0] == messages[1], (at, messages)
            if bad is version:
                assert "checksum mismatch" in messages[0]


def _handmade(store, tensors, *, header_order, name="layers/h.safetensors", length=None):
    """A committed safetensors file written by hand: ``tensors`` ((key, dtype, shape,
    bytes), in file order), its header listing them in ``header_order``; ``length``:
    the header length the file claims (default: the true one)."""
    from layercheck.storage.format import checksum, layer_metadata
    spans, at = {}, 0
    for key, dtype, shape, raw in tensors:
        spans[key] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    header = {"__metadata__": layer_metadata("a", 3), **{key: spans[key] for key in header_order}}
    data = _file(header, b"".join(raw for *_, raw in tensors))
    if length is not None:
        data = length.to_bytes(8, "little") + data[8:]
    store.write_atomic(name, data)
    return data, Version(step=3, file=name, bytes=len(data), checksum=checksum(data), layer="a",
                         reason="threshold")


def test_tensors_read_apart_in_runs_are_placed_where_the_file_has_them(tmp_path):
    """Neighbours bound for the same buffer, a buffer filled in several runs, empty
    and one-byte tensors, a header in neither file nor name order: every tensor's
    bytes are where ``places`` says, in the buffer ``apart_keys`` says, each buffer
    holding its tensors back to back in file order."""
    import uuid
    import numpy as np
    from layercheck.storage.layerread import read_verified_file
    rng = np.random.default_rng(15)
    layout = [("z", "F32", [3], False), ("q", "I64", [2], False),  # data, data
              ("m", "F32", [2], True), ("k", "F16", [3], True),  # apart, apart
              ("y", "U8", [1], False),  # a one-byte run
              ("e", "I32", [2], True), ("c", "F64", [1], False),
              ("d", "BF16", [0], True),  # an empty run apart, between two of data
              ("b", "I16", [2], False), ("a", "U8", [3], True)]
    sizes = {"F32": 4, "I64": 8, "F16": 2, "U8": 1, "I32": 4, "F64": 8, "BF16": 2, "I16": 2}
    tensors = [(key, dtype, shape, rng.integers(0, 256, sizes[dtype] * int(np.prod(shape)),
                                                dtype=np.uint8).tobytes())
               for key, dtype, shape, _ in layout]
    chosen = {key for key, *_, into in layout if into}
    raw = {key: data for key, _, _, data in tensors}
    order = ["k", "a", "z", "c", "m", "y", "b", "q", "e", "d"]
    for store in (LocalStore(tmp_path), open_store(f"memory://runs-{uuid.uuid4().hex}")):
        data, version = _handmade(store, tensors, header_order=order)
        whole, apart = read_verified_file(store, version), read_verified_file(store, version, chosen.__contains__)
        assert apart.apart_keys == chosen and apart.nbytes == len(data)
        assert bytes(apart.apart) == b"".join(raw[key] for key, *_ in tensors if key in chosen)
        assert bytes(apart.data) == data[:whole.data_start] + b"".join(
            raw[key] for key, *_ in tensors if key not in chosen)
        for file in (whole, apart):
            places = file.places()
            assert list(places) == order
            for key, (buffer, at) in places.items():
                assert buffer is (apart.apart if file is apart and key in chosen else file.data), key
                assert bytes(buffer[at:at + len(raw[key])]) == raw[key], key


def test_a_file_without_tensor_bytes_read_apart_still_keeps_the_chosen_apart(tmp_path):
    """A data section of no bytes (every tensor empty: the header ends the file):
    the chosen tensors are apart all the same, in an empty buffer of their own."""
    from layercheck.storage.layerread import read_verified_file
    store = LocalStore(tmp_path)
    data, version = _handmade(store, [("e", "F32", [0], b""), ("f", "U8", [0, 4], b"")],
                              header_order=["f", "e"])
    verified = read_verified_file(store, version, lambda key: key == "e")
    assert verified.apart_keys == {"e"} and len(verified.apart) == 0
    assert bytes(verified.data) == data
    assert verified.places() == {"f": (verified.data, len(data)), "e": (verified.apart, 0)}


def test_a_header_longer_than_its_file_read_apart_is_named_as_a_whole_read_names_it(tmp_path):
    """A header length a few bytes past the end of the file (checksummed as it is):
    the same 'not a valid safetensors file' as a whole read gives, whichever store."""
    import uuid
    from layercheck.contract.errors import CorruptVersion
    from layercheck.storage.layerread import read_verified_file
    tensors = [("w", "F32", [2], bytes(range(8)))]
    for store in (LocalStore(tmp_path), open_store(f"memory://long-{uuid.uuid4().hex}")):
        size = len(_handmade(store, tensors, header_order=["w"])[0])
        for past in (1, 8):  # the header would end one byte, eight bytes, past the end
            _, version = _handmade(store, tensors, header_order=["w"], length=size - 8 + past)
            messages = []
            for how in (None, lambda key: True):
                with pytest.raises(CorruptVersion) as err:
                    read_verified_file(store, version, how)
                messages.append(str(err.value))
            assert messages[0] == messages[1] and "not a valid safetensors file" in messages[0]


def test_read_again_replays_only_a_manifest_that_changed(tmp_path):
    from layercheck.storage.manifest import read_again
    store = LocalStore(tmp_path)
    _write(store, HEADER, _layer(1), _state(1), tail=b"garbage\n")
    view = read_manifest(store)
    assert read_again(store, view) is view  # not a byte changed: the same replay
    _write(store, {"kind": "drop", "file": _state(1)["file"]})
    now = read_again(store, view)
    assert now is not view and now.states == {} and now.problems == view.problems
    assert read_again(store, read_manifest(store, rank=1)).rank == 1


def test_a_sharded_backend_on_one_rank_names_its_unsuffixed_files_and_is_live(tmp_path):
    """A sharded backend (FSDP2, ZeRO) resumed on one rank commits records with one
    ``shards`` entry naming the file the writer names there, without a rank suffix:
    replay keeps those versions (they are the newest step), as it does a 2-rank
    layout's suffixed shards."""
    store = LocalStore(tmp_path)

    def sharded(step, layer, ranks, layout):
        suffix = (lambda r: f".rank{r:05d}") if ranks > 1 else (lambda r: "")
        stem = f"layers/{layer}@{step:09d}" if layer else f"states/{step:09d}"
        shards = [{"file": f"{stem}{suffix(r)}.safetensors", "bytes": 1,
                   "checksum": "crc32:00000000"} for r in range(ranks)]
        record = {"kind": "layer" if layer else "state", "step": step, "shards": shards,
                  **({"layer": layer, "reason": "threshold"} if layer else {})}
        return {**record, "layout": layout} if layout else record

    _write(store, {**HEADER, "world_size": 2}, sharded(1, "a", 2, 0), sharded(1, None, 2, 0),
           {"kind": "resume", "step": 1},
           {"kind": "layout", "id": 1, "world_size": 1, "facts": {}},
           sharded(2, "a", 1, 1), sharded(2, None, 1, 1))
    view = read_manifest(store)
    assert view.problems == []
    assert view.latest_step() == 2 and [v.step for v in view.versions["a"]] == [1, 2]
    assert view.versions["a"][-1].files == ["layers/a@000000002.safetensors"]
