"""The flat-range arithmetic of ZeRO partitions (``layercheck.backends.partitioning``), torch-free.

Layouts are built here by DeepSpeed's rules (ZeRO-3: p = ceil(numel / W) per
parameter; ZeRO-1/2: the group's concatenation padded to 2*W, P = padded / W), as
the header records them; the properties hold for every W -> W' and every change
of stage or sub-grouping: each new partition's pieces tile every parameter exactly
once, read no padding, and put each element where the new layout holds it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from layercheck.contract.errors import LayerCheckError, ModelMismatch
from layercheck.storage.format import sub_group
from layercheck.backends.partitioning import PLAIN, ZERO3, ZERO12, FlatGroup, Partitioning


def layout(kind: str, world: int, groups: list[list[tuple[str, int]]]) -> Partitioning:
    """``groups`` of (name, numel) laid out over ``world`` ranks as DeepSpeed does."""
    if kind == PLAIN:
        return Partitioning(kind=PLAIN, world_size=1)
    out = []
    for k, params in enumerate(groups):
        if kind == ZERO3:
            size = sum(math.ceil(n / world) for _, n in params)
        else:
            total = sum(n for _, n in params)
            size = math.ceil(total / (2 * world)) * 2  # padded to 2*world, split in world
        out.append(FlatGroup(index=k, layer=f"l{k}", params=tuple(params), partition_numel=size))
    return Partitioning(kind=kind, world_size=world, groups=tuple(out))


def split(params: list[tuple[str, int]], cuts: list[int]) -> list[list[tuple[str, int]]]:
    bounds = sorted({c % len(params) for c in cuts} - {0})
    return [params[a:b] for a, b in zip([0, *bounds], [*bounds, len(params)])]


def value(name: str, element: int) -> int:
    """A distinct nonzero value per parameter element (0 is padding)."""
    return int(name[1:]) * 1_000_000 + element + 1


def files(source: Partitioning, params: dict[str, int]) -> dict[tuple[int, str], np.ndarray]:
    """Every (rank, owner) flat tensor of ``source``, each element its value, padding 0."""
    out = {}
    if source.kind == PLAIN:
        return {(0, name): np.array([value(name, e) for e in range(n)], dtype=np.int64)
                for name, n in params.items()}
    for rank in range(source.world_size):
        for g in source.groups:
            flat = np.zeros(g.partition_numel, dtype=np.int64)
            for seg in source.segments(rank, g.index):
                flat[seg.offset:seg.offset + seg.stop - seg.start] = [
                    value(seg.param, e) for e in range(seg.start, seg.stop)]
            out[(rank, sub_group(g.index))] = flat
    return out


kinds = st.sampled_from([PLAIN, ZERO3, ZERO12])
sizes = st.lists(st.integers(1, 40), min_size=1, max_size=7)


@settings(max_examples=300, deadline=None)
@given(sizes=sizes, old=kinds, new=st.sampled_from([ZERO3, ZERO12]), w=st.integers(1, 6),
       w2=st.integers(1, 6), cuts=st.lists(st.integers(0, 6), max_size=3),
       cuts2=st.lists(st.integers(0, 6), max_size=3))
def test_every_new_partition_reads_each_parameter_element_exactly_once_and_no_padding(
        sizes, old, new, w, w2, cuts, cuts2):
    params = [(f"p{j}", n) for j, n in enumerate(sizes)]
    source = layout(old, 1 if old == PLAIN else w, split(params, cuts))
    target = layout(new, w2, split(params, cuts2))
    stored = files(source, dict(params))
    seen = {name: np.zeros(n, dtype=np.int64) for name, n in params}
    for g in target.groups:
        for rank in range(w2):
            partition = np.zeros(g.partition_numel, dtype=np.int64)
            written = np.zeros(g.partition_numel, dtype=np.int64)
            for piece in source.pieces(target, rank, g.index):
                data = stored[(piece.rank, piece.owner)][piece.start:piece.stop]
                assert len(data) == piece.stop - piece.start > 0
                assert (data != 0).all()  # never padding
                partition[piece.offset:piece.offset + len(data)] = data
                written[piece.offset:piece.offset + len(data)] += 1
            assert written.max(initial=0) <= 1  # pieces never overlap in the new partition
            expected = np.zeros_like(partition)
            for seg in target.segments(rank, g.index):
                expected[seg.offset:seg.offset + seg.stop - seg.start] = [
                    value(seg.param, e) for e in range(seg.start, seg.stop)]
                seen[seg.param][seg.start:seg.stop] += 1
            np.testing.assert_array_equal(partition, expected)  # padding stays 0
    for name, count in seen.items():  # every element of every parameter, exactly once
        assert (count == 1).all(), name


@settings(max_examples=200, deadline=None)
@given(sizes=sizes, kind=st.sampled_from([ZERO3, ZERO12]), w=st.integers(1, 6),
       cuts=st.lists(st.integers(0, 6), max_size=3))
def test_locate_gives_back_what_segments_put_there(sizes, kind, w, cuts):
    params = [(f"p{j}", n) for j, n in enumerate(sizes)]
    part = layout(kind, w, split(params, cuts))
    stored = files(part, dict(params))
    for name, n in params:
        whole = np.zeros(n, dtype=np.int64)
        for where in part.locate(name, 0, n):
            whole[where.at:where.at + where.stop - where.start] = \
                stored[(where.rank, where.owner)][where.start:where.stop]
        assert whole.tolist() == [value(name, e) for e in range(n)]


def test_zero3_and_zero12_segments_follow_deepspeeds_rules():
    params = [("p0", 5), ("p1", 3)]
    z3 = layout(ZERO3, 2, [params])  # p = 3 and 2: partitions of 5
    assert [(s.param, s.start, s.stop, s.offset) for s in z3.segments(1, 0)] == \
        [("p0", 3, 5, 0), ("p1", 2, 3, 3)]
    z12 = layout(ZERO12, 2, [params])  # 8 elements, padded to 8: partitions of 4
    assert [(s.param, s.start, s.stop, s.offset) for s in z12.segments(1, 0)] == \
        [("p0", 4, 5, 0), ("p1", 0, 3, 1)]


def zero_facts(stage: int, **layout_options) -> dict:
    return {"zero": {"stage": stage, "sub_groups": [
        {"sub_group": 0, "group": 0, "layer": "a", "params": [["w", [2, 3]], ["b", [3]]],
         "partition_numel": 5 if stage == 3 else 6}],
        "checkpoint": {"mp_world_size": 1, "layout": layout_options}}}


def test_from_facts_reads_the_header_facts_and_refuses_what_it_cannot_express():
    assert Partitioning.from_facts({}, 1).kind == PLAIN
    assert Partitioning.from_facts(zero_facts(3), 2).groups[0].params == (("w", 6), ("b", 3))
    assert Partitioning.from_facts(zero_facts(1), 2).kind == ZERO12
    with pytest.raises(LayerCheckError, match="round_robin_gradients.*own world size"):
        Partitioning.from_facts(zero_facts(2, round_robin_gradients=True), 2)
    with pytest.raises(LayerCheckError, match="parameter_alignment"):
        Partitioning.from_facts(zero_facts(2, parameter_alignment=True), 2)
    with pytest.raises(ModelMismatch, match="need partitions of 5 elements.*say 6"):
        Partitioning.from_facts({"zero": {**zero_facts(3)["zero"], "sub_groups": [
            {**zero_facts(3)["zero"]["sub_groups"][0], "partition_numel": 6}]}}, 2)
    with pytest.raises(LayerCheckError, match="without ZeRO facts"):
        Partitioning.from_facts({}, 2)
    with pytest.raises(LayerCheckError, match="malformed"):
        Partitioning.from_facts({"zero": {"stage": 3}}, 2)
    with pytest.raises(ModelMismatch, match="in no sub-group"):
        Partitioning.from_facts(zero_facts(3), 2).locate("other", 0, 1)
