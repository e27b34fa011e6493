"""The on-disk format in one place: keys, records and the state document (torch-free)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from layercheck.errors import CorruptVersion
from layercheck.format import (STATE_FORMAT, Shard, Version, header_record, module_tensors,
                               optimizer_fields, read_state_document, sub_group, tensor_key)


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
    plain = header_record(layers=[], config={}, lr_peak=1e-3)
    zero = header_record(layers=[], config={}, lr_peak=1e-3, world_size=2, zero={"stage": 3})
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
            "import layercheck.format, layercheck.manifest, layercheck.inspection, "
            "layercheck.errors")
    subprocess.run([sys.executable, "-c", code], check=True)
