"""Which copy a restore takes (``layercheck.tiers.choice``) and where buddies go
(``layercheck.tiers.buddy.placement``): pure functions, every rank computing the same."""
from __future__ import annotations

import pytest

from layercheck.tiers.buddy import placement
from layercheck.tiers.choice import Copy, choose


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
