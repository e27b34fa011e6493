"""Which copy a restore takes (``layercheck.tiers.choice``) and where buddies go
(``layercheck.tiers.buddy.placement``): pure functions, every rank computing the same."""
from __future__ import annotations

import pytest

from layercheck.tiers.buddy import placement
from layercheck.tiers.choice import Copy, choose
from layercheck.tiers.shards import tier_layout, usable


def copy(of: int, holder: int, step: int, layers=(True, True), state: bool = True) -> Copy:
    return Copy(of, holder, "rank" if of == holder else "ward", step % 2, step, state,
                tuple(layers), {})


def test_own_memory_first_then_the_buddy_then_an_older_slot_then_storage():
    copies = [copy(0, 0, 9), copy(0, 0, 8), copy(1, 0, 9, layers=(True, False)),
              copy(1, 0, 8), copy(1, 1, 8)]  # rank 1's tier holds 8 only: 9 was being written
    choice = choose(copies, 2, 2, durable_state=6, durable_layers=[[2, 6], [2, 4]])
    assert choice.step == 9
    assert choice.sources(0) == [("memory", 9), ("memory", 9)]
    assert choice.state[1].holder == 0  # the buddy's state of step 9
    assert choice.sources(1) == [("buddy", 9), ("memory", 8)]  # at a tie, its own


def test_storage_where_no_memory_copy_is_fresher():
    copies = [copy(0, 0, 9, layers=(True, False)), copy(0, 0, 8, layers=(True, False))]
    choice = choose(copies, 1, 2, durable_state=9, durable_layers=[[9], [7]])
    assert choice.sources(0) == [("memory", 9), ("storage", None)]
    # storage committed a newer step: memory's consistent step all the same
    choice = choose([copy(0, 0, 5)], 1, 2, durable_state=9, durable_layers=[[9], [3]])
    assert choice.step == 5 and choice.state[0] is not None
    assert choice.sources(0) == [("memory", 5), ("memory", 5)]
    # no memory step: storage's
    choice = choose([], 1, 2, durable_state=9, durable_layers=[[9], [3]])
    assert choice.step == 9 and choice.from_storage()


def test_a_sharded_layer_comes_from_one_step_on_every_rank():
    # rank 1's layer 1 of step 9 is damaged in its memory and at its buddy
    copies = [copy(0, 0, 9), copy(0, 0, 8), copy(1, 1, 9, layers=(True, False)),
              copy(1, 1, 8), copy(1, 0, 9, layers=(True, False))]
    replicated = choose(copies, 2, 2, durable_state=6, durable_layers=[[2], [2]])
    assert replicated.sources(0)[1] == ("memory", 9) and replicated.sources(1)[1] == ("memory", 8)
    sharded = choose(copies, 2, 2, durable_state=6, durable_layers=[[2], [2]], aligned=True)
    assert [sharded.sources(r) for r in (0, 1)] == [[("memory", 9), ("memory", 8)]] * 2
    # storage holds a version newer than the step every rank has: storage on every rank
    sharded = choose(copies, 2, 2, durable_state=6, durable_layers=[[2], [2, 9]], aligned=True)
    assert [sharded.sources(r)[1] for r in (0, 1)] == [("storage", None)] * 2
    # no step in common at all: storage on every rank, even where rank 0's copy is intact
    only = [copy(0, 0, 9), copy(1, 1, 9, layers=(True, False))]
    sharded = choose(only, 2, 2, durable_state=6, durable_layers=[[2], [2]], aligned=True)
    assert [sharded.sources(r)[1] for r in (0, 1)] == [("storage", None)] * 2


def test_a_copy_of_another_sharded_layout_is_not_used_as_it_is():
    fsdp2 = tier_layout(2, {"fsdp": {}}, 0)
    assert usable(fsdp2, tier_layout(2, {"fsdp": {}}, 3))  # another job of the same layout
    assert not usable(fsdp2, tier_layout(1, {"fsdp": {}}, 1))
    assert not usable(tier_layout(2, {"zero": {"stage": 2}}, 0),
                      tier_layout(2, {"zero": {"stage": 3}}, 0))
    assert not usable(None, fsdp2)  # a plain module's copy under FSDP2
    assert usable(tier_layout(2, {}, 0), tier_layout(1, {}, 1))  # replicated: any world size
    assert usable(None, tier_layout(1, {}, 0))


def test_the_step_is_one_every_rank_has_and_a_damaged_state_does_not_count():
    copies = [copy(0, 0, 9), copy(0, 0, 8), copy(1, 1, 9, state=False), copy(1, 1, 8)]
    assert choose(copies, 2, 2, None, [[], []]).step == 8
    assert choose([copy(0, 0, 9)], 2, 2, None, [[], []]) is None  # rank 1 has nothing
    assert choose([], 1, 2, None, [[], []]) is None


@pytest.mark.parametrize("nodes", [["a", "b"], ["a", "a", "b", "b"], ["b", "a", "b", "a"],
                                   ["a", "a", "b", "b", "c", "c"], ["a", "b", "c"]])
def test_a_buddy_is_never_on_its_ranks_node(nodes):
    buddy = placement(nodes)
    assert sorted(buddy) == list(range(len(nodes)))  # each rank is one rank's buddy
    assert all(nodes[buddy[r]] != nodes[r] for r in range(len(nodes)))


def test_told_racks_the_buddy_is_on_another_rack():
    nodes, racks = ["a", "b", "c", "d"], ["r1", "r1", "r2", "r2"]
    buddy = placement(nodes, racks)
    assert all(racks[buddy[r]] != racks[r] for r in range(4))


def test_no_placement_when_a_node_holds_more_than_half_the_ranks():
    with pytest.raises(ValueError, match="another node"):
        placement(["a", "a", "a", "b"])
    with pytest.raises(ValueError):
        placement(["a", "a"])
