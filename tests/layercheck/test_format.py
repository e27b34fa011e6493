"""The on-disk format in one place: keys, records and the state document (torch-free)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from layercheck.contract.errors import CorruptVersion
from layercheck.storage.format import (STATE_FORMAT, Shard, Version, header_record,
                                       module_tensors, optimizer_fields, read_state_document,
                                       sub_group, tensor_key)


def test_keys_name_what_a_layer_file_holds_and_parse_back():
    keys = {tensor_key("param", "a.weight"): 1, tensor_key("buffer", "a.mask"): 2,
            tensor_key("master", sub_group(3)): 3, tensor_key("optim", "a.weight", "exp_avg"): 4,
            tensor_key("optim", "a.weight", "step"): 5, tensor_key("optim", "sg3", "step"): 6}
    assert list(keys)[:4] == ["param/a.weight", "buffer/a.mask", "master/sg3",
                              "optim/exp_avg/a.weight"]
    assert optimizer_fields(keys, "a.weight") == {"exp_avg": 4, "step": 5}
    assert optimizer_fields(keys, "sg3") == {"step": 6}
    assert module_tensors(keys) == {"a.weight": 1, "a.mask": 2}
    assert module_tensors(keys, kinds=("buffer",)) == {"a.mask": 2}


def test_the_state_document_reads_both_layouts_of_extra():
    new = {"step": 3, "extra": {"position": 24}, "engine": {"global_steps": 3}}
    assert read_state_document({"format": STATE_FORMAT, "state": json.dumps(new)}) == new
    # ZeroLayerCheck before the lifecycle was one: the user's extra and DeepSpeed's
    # counters both under "extra"
    old = {"step": 3, "extra": {"user": {"position": 24}, "_deepspeed": {"global_steps": 3}}}
    doc = read_state_document({"format": "layercheck-state/1", "state": json.dumps(old)})
    assert doc["extra"] == {"position": 24} and doc["engine"] == {"global_steps": 3}
    plain = {"step": 3, "extra": {"position": 24}}  # plain LayerCheck, state/1: no engine
    doc = read_state_document({"format": "layercheck-state/1", "state": json.dumps(plain)})
    assert doc["extra"] == {"position": 24} and doc["engine"] is None
    with pytest.raises(CorruptVersion, match="unreadable"):
        read_state_document({"format": STATE_FORMAT, "state": "{not json"})


def test_a_header_names_its_world_size_only_when_sharded():
    layers = [{"name": "a", "kind": "block", "params": 4}]  # a header lists the model's layers
    plain = header_record(layers=layers, config={}, lr_peak=1e-3)
    zero = header_record(layers=layers, config={}, lr_peak=1e-3, world_size=2, zero={"stage": 3})
    assert "world_size" not in plain and plain["kind"] == "header"
    assert zero["world_size"] == 2 and zero["zero"] == {"stage": 3}


def test_a_sharded_version_is_one_version_per_rank():
    shards = (Shard("layers/a@1.rank0", 10, "crc32:0"), Shard("layers/a@1.rank1", 11, "crc32:1"))
    sharded = Version(1, "layers/a@1.rank1", 11, "crc32:1", "a", "base", shards)
    assert [(v.file, v.bytes, v.layer) for v in sharded.per_rank()] == [
        ("layers/a@1.rank0", 10, "a"), ("layers/a@1.rank1", 11, "a")]
    plain = Version(1, "layers/a@1", 10, "crc32:0", "a", "base")
    assert plain.per_rank() == [plain]


def test_the_format_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; "
            "import layercheck.storage.format, layercheck.storage.manifest, layercheck.storage.layerread, layercheck.tools.inspection, "
            "layercheck.contract.errors")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_new_records_use_crc32c_and_records_of_either_algorithm_verify():
    import zlib

    from layercheck.storage.format import CHECKSUM, Checksummer, checksum, checksum_matches
    assert CHECKSUM == "crc32c"  # google-crc32c's compiled extension is installed
    # the standard check value of CRC-32C (RFC 3720, appendix B.4)
    assert checksum(b"123456789") == "crc32c:e3069283"
    data = bytes(range(256)) * 1000
    streamed = Checksummer()
    for start in range(0, len(data), 4097):  # pieces that straddle no natural boundary
        streamed.update(memoryview(data)[start:start + 4097])
    assert streamed.value == checksum(data)
    old = f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"  # what records said before CRC-32C
    assert checksum_matches(data, old) and checksum_matches(data, checksum(data))
    damaged = data[:-1] + b"\x00"
    assert not checksum_matches(damaged, old) and not checksum_matches(damaged, checksum(data))


def test_a_record_naming_an_unknown_checksum_says_to_upgrade():
    from layercheck.storage.format import checksum_matches
    with pytest.raises(CorruptVersion, match="newer layercheck.*upgrade"):
        checksum_matches(b"abc", "blake9:00000000")


def test_the_crc32c_that_lets_other_threads_run_is_google_crc32c_s_own():
    """Pieces of 64 KiB and more go to google-crc32c's C library through ctypes (the
    GIL released meanwhile), smaller ones to its extension: one checksum either way,
    whatever the cut, from bytes, memoryviews and numpy arrays."""
    import google_crc32c
    import numpy as np

    from layercheck.storage import checksums as fmt  # the checksums moved out of format (issue 27)
    assert fmt._CRC32C_EXTEND is not None  # the wheel's library is found here
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    expected = f"crc32c:{google_crc32c.value(data.tobytes()):08x}"
    for cuts in ([0, len(data)], [0, 1, 65535, 65536 + 65535, 1 << 20, len(data)],
                 [0, 65536, 65537, 3 << 19, len(data) - 7, len(data)]):
        summer = fmt.Checksummer("crc32c")
        for n, (a, b) in enumerate(zip(cuts, cuts[1:])):
            piece = data[a:b]
            summer.update(memoryview(piece) if n % 3 == 0 else piece.tobytes() if n % 3 == 1
                          else memoryview(piece.tobytes()))
        assert summer.value == expected, cuts


# -- the record schema (issue 27, item 9) ------------------------------------------------
LAYERS = [{"name": "a", "kind": "block", "params": 4, "weight_bytes": 16}]


def test_every_record_layercheck_writes_passes_its_schema():
    from layercheck.storage.format import MAX_COUNT, check_record, drop_record, resume_record
    shards = (Shard("layers/a@1.rank0", 10, "crc32c:0000000a"), Shard("layers/a@1.rank1", 11,
                                                                      "crc32:0000000b"))
    records = [header_record(layers=LAYERS, config={"write_budget": 5e5, "smax": 10}, lr_peak=0.0),
               header_record(layers=LAYERS, config={}, lr_peak=1e-3, world_size=2, zero={}),
               Version(3, "layers/a@3", 10, "crc32c:0000000a", "a", "base").to_record(),
               Version(3, "layers/a@3.rank0", 10, "crc32:0", "a", None, shards).to_record(),
               Version(MAX_COUNT, "states/x", 0, "crc32c:00000000").to_record(),
               resume_record(3), drop_record("layers/a@3"),
               {"kind": "layer", "step": 1, "layer": "a", "file": "layers/a@1", "bytes": 1,
                "checksum": "blake9:00", "a newer writer's field": [1]}]  # unknown: ignored
    for record in records:
        assert check_record(record) is record


@pytest.mark.parametrize("record,wrong", [
    ({"kind": "header", "layers": LAYERS, "world_size": float("inf")}, "world_size=inf"),
    ({"kind": "header", "layers": LAYERS, "world_size": [2]}, "world_size=[2]"),
    ({"kind": "header", "layers": LAYERS, "world_size": 2**31}, "world_size=2147483648"),
    ({"kind": "header", "layers": LAYERS, "world_size": True}, "world_size=True"),
    ({"kind": "header", "layers": LAYERS, "config": [1, 2]}, "config=[1, 2]: an object"),
    ({"kind": "header", "layers": LAYERS, "config": {"write_budget": [1]}}, "write_budget=[1]"),
    ({"kind": "header", "layers": LAYERS, "config": {"write_budget": 0}}, "write_budget=0"),
    ({"kind": "header", "layers": LAYERS, "lr_peak": float("nan")}, "lr_peak=nan"),
    ({"kind": "header", "layers": LAYERS, "zero": [3]}, "zero=[3]"),
    ({"kind": "header", "layers": []}, "layers=[]"),
    ({"kind": "header", "layers": [{**LAYERS[0], "params": 2**63}]}, "params=9223372036854775808"),
    ({"kind": "layer", "step": 2**70, "layer": "a", "file": "f", "bytes": 1, "checksum": "c:0"},
     "step=1180591620717411303424"),
    ({"kind": "layer", "step": 1, "layer": "a", "file": "f", "bytes": 1, "checksum": "c:0",
      "reason": {"why": 1}}, "reason={'why': 1}: a string, or null"),
    ({"kind": "layer", "step": 1, "layer": 3, "file": "f", "bytes": 1, "checksum": "c:0"},
     "layer=3: a string is required"),
    ({"kind": "layer", "step": 1, "layer": "a", "bytes": 1, "checksum": "c:0"}, "file is missing"),
    ({"kind": "state", "step": 1, "file": "f", "bytes": 1.0, "checksum": "c:0"}, "bytes=1.0"),
    ({"kind": "state", "step": 1, "file": "f", "bytes": 1, "checksum": 7}, "checksum=7"),
    ({"kind": "state", "step": 1, "shards": []}, "shards=[]"),
    ({"kind": "state", "step": 1, "shards": [{"file": "f", "bytes": -1, "checksum": "c:0"}]},
     "entry 0: bytes=-1"),
    ({"kind": "state", "step": 1, "file": "../f", "bytes": 1, "checksum": "c:0"}, "refusing path"),
    ({"kind": "resume", "step": "3"}, "step='3'"),
    ({"kind": "drop", "file": ["layers/a"]}, "file=['layers/a']: a relative path"),
    ({"kind": ["header"]}, "unknown record kind ['header']"),
    ({"kind": "resume", "step": 1, "x": json.loads("[" * 64 + "]" * 64)}, "deeper than 64"),
])
def test_a_record_outside_its_schema_is_refused_naming_the_field(record, wrong):
    from layercheck.storage.format import check_record
    with pytest.raises(ValueError) as err:
        check_record(record)
    assert wrong in str(err.value), str(err.value)


def test_a_value_is_shown_cut_short_in_the_message():
    from layercheck.storage.format import check_record
    with pytest.raises(ValueError) as err:
        check_record({"kind": "resume", "step": "x" * 10**6})
    assert len(str(err.value)) < 200


def test_a_model_config_is_a_json_object_nesting_at_most_64_deep():
    from layercheck.storage.format import parse_model_config
    assert parse_model_config(b'{"model_type": "qwen2", "rope_scaling": {"factor": 2}}') == {
        "model_type": "qwen2", "rope_scaling": {"factor": 2}}
    assert parse_model_config(b'{"a":' * 63 + b"1" + b"}" * 63)  # 63 objects: at the limit
    for data, wrong in [(b"[" * 100_000 + b"]" * 100_000, "nested too deep to read"),
                        (b'{"a":' * 65 + b"1" + b"}" * 65, "deeper than 64"),
                        (b"[1]", "not a JSON object"), (b"\xff", "not JSON")]:
        with pytest.raises(CorruptVersion, match=wrong):
            parse_model_config(data)


def test_a_layer_named_by_an_empty_prefix_is_a_layer_the_schema_accepts():
    """An explicit layer map may name a layer '' (its files are '_@<step>'): such a
    checkpoint was readable before the schema and stays so."""
    from layercheck.storage.format import check_record
    check_record(header_record(layers=[{"name": "", "kind": "head", "params": 8}], config={},
                               lr_peak=1e-3))
    check_record(Version(1, "layers/_@000000001.safetensors", 1, "crc32:0", "", "base").to_record())
