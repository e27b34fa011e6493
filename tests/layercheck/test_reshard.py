"""Flat tensors assembled from another layout's pieces (``layercheck.backends.reshard``), without DeepSpeed:
rank files built by hand in ZeRO-3's layout, read through a ``read`` that counts."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from layercheck.contract.errors import LayerCheckError, ModelMismatch
from layercheck.backends.partitioning import Partitioning
from layercheck.backends.reshard import step_of, zero_layer_tensors

W = torch.arange(1.0, 7.0).view(2, 3)
B = torch.tensor([10.0, 20.0, 30.0])
FACTS = {"zero": {"stage": 3, "checkpoint": {"mp_world_size": 1, "layout": {}}, "sub_groups": [
    {"sub_group": 0, "group": 0, "layer": "l", "params": [["w", [2, 3]], ["b", [3]]],
     "partition_numel": 5}]}}
WRITTEN = SimpleNamespace(world_size=2, facts=FACTS)


def rank_files(scale: dict[str, float], steps=(3.0, 3.0), dtype=torch.float32):
    """Each rank's tensors: ZeRO-3 on 2 ranks, w's and b's halves back to back, padding 0;
    a field's value is the master times ``scale[field]``."""
    w, b = W.reshape(-1), B
    halves = [torch.cat([w[0:3], b[0:2]]), torch.cat([w[3:6], b[2:3], torch.zeros(1)])]
    files = []
    for r, flat in enumerate(halves):
        files.append({"master/sg0": flat.to(dtype),
                      **{f"optim/{f}/sg0": (flat * s).to(dtype) for f, s in scale.items()},
                      "optim/step/sg0": torch.tensor(steps[r]), "buffer/m": torch.ones(2)})
    return files


class Reader:
    def __init__(self, files):
        self.files, self.elements = files, 0

    def __call__(self, rank, key, start, stop):
        self.elements += stop - start
        return self.files[rank][key].reshape(-1)[start:stop]


def live():
    w, b, frozen = (torch.nn.Parameter(torch.zeros(s)) for s in ((2, 3), (3,), (4,)))
    optimizer = torch.optim.AdamW([w, b])
    return [("w", w), ("b", b), ("frozen", frozen)], optimizer


def test_each_parameter_and_its_moments_come_back_whole_reading_no_padding():
    params, optimizer = live()
    read = Reader(rank_files({"exp_avg": 2.0, "exp_avg_sq": 3.0}))
    out = zero_layer_tensors(WRITTEN, "l", params, [("m", torch.zeros(2))], read, optimizer)
    assert torch.equal(out["param/w"], W) and torch.equal(out["param/b"], B)
    assert torch.equal(out["optim/exp_avg/w"], 2 * W) and torch.equal(out["optim/exp_avg_sq/b"], 3 * B)
    assert float(out["optim/step/w"]) == 3.0 and torch.equal(out["buffer/m"], torch.ones(2))
    assert out["param/frozen"] is not None and torch.equal(out["param/frozen"], torch.zeros(4))
    assert "optim/exp_avg/frozen" not in out  # not in the version: it keeps its live value
    # the 9 elements of w and b, three times (master, two moments), each step once, the buffer
    assert read.elements == 3 * 9 + 2 * 1 + 2


def test_what_cannot_be_read_back_is_refused_with_the_reason():
    params, optimizer = live()
    moments = {"exp_avg": 1.0, "exp_avg_sq": 1.0}
    # one new partition of w and b, which came from two flat tensors counting differently
    two = {"zero": {**FACTS["zero"], "sub_groups": [
        {"sub_group": 0, "group": 0, "layer": "l", "params": [["w", [2, 3]]], "partition_numel": 3},
        {"sub_group": 1, "group": 1, "layer": "l", "params": [["b", [3]]], "partition_numel": 2}]}}
    steps = Reader([{"optim/step/sg0": torch.tensor(3.0), "optim/step/sg1": torch.tensor(4.0)}] * 2)
    with pytest.raises(ModelMismatch, match=r"different Adam step counts \(\[3.0, 4.0\]\)"):
        step_of(steps, Partitioning.from_facts(two, 2), ["w", "b"], "l")
    with pytest.raises(ModelMismatch, match="dtype it was trained in"):
        zero_layer_tensors(WRITTEN, "l", params, [],
                           Reader(rank_files(moments, dtype=torch.bfloat16)), optimizer)
    with pytest.raises(LayerCheckError, match="Adam's state.*SGD"):
        zero_layer_tensors(WRITTEN, "l", params, [], Reader(rank_files(moments)),
                           torch.optim.SGD([p for _, p in params], lr=0.1))
    with pytest.raises(LayerCheckError, match="written by a single process"):
        zero_layer_tensors(SimpleNamespace(world_size=1, facts={}), "l", params, [],
                           Reader(rank_files(moments)), optimizer)
    wrong = [("w", torch.nn.Parameter(torch.zeros(7)))]
    with pytest.raises(ModelMismatch, match="7 here"):
        zero_layer_tensors(WRITTEN, "l", wrong, [], Reader(rank_files(moments)), optimizer)
